module rolter.dev/kvwatcher

go 1.26
