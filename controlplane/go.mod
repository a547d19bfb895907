module rolter.dev/controlplane

go 1.26
