module rolter.dev/dataplane

go 1.26.0

require rolter.dev/pkg v0.0.0

require github.com/prometheus/client_golang v1.25.0 // indirect

replace rolter.dev/pkg => ../pkg
