// Package controlplane will hold rolter's control plane: routes, providers
// and virtual keys in etcd, a gRPC admin API, and versioned config snapshots
// pushed to every data plane and kvwatcher. Not built yet; see the issues.
package controlplane
