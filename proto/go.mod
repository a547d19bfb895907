module rolter.dev/proto

go 1.26
