// Package controlplane is rolter's control plane: routes, providers and
// virtual keys stored in etcd, a gRPC admin API (rolterctl), and versioned
// config snapshots pushed to every data plane and kvwatcher.
//
// # Overview
//
//   - app assembles a process (cmd/rolter-controlplane, and the tests).
//   - internal/state models the stored config and converts it to and from
//     pkg/config, TOML and diffs.
//   - internal/store keeps it in etcd, one key per object, written in
//     optimistic transactions.
//   - internal/watch follows etcd with list-then-watch.
//   - internal/push serves snapshots (xDS-style ACK/NACK) and tracks nodes.
//   - internal/admin implements the admin service; internal/auth the
//     bearer tokens; internal/ctl is rolterctl.
//
// README.md in this directory describes the API, the key layout, the
// snapshot payload and the security model.
package controlplane
