module rolter.dev/dataplane

go 1.26
