// Package cpfollow makes a data plane follow control planes: it keeps a
// Watch stream to one of them, compiles every pushed snapshot with
// pkg/config (the same code as file mode), applies it, and answers each
// with an ACK or a NACK carrying the reason.
//
// # Overview
//
// The follower tries the configured addresses in turn; when a round of all
// of them fails it waits a jittered, capped backoff. While no control plane
// is reachable the proxy keeps serving the last snapshot it applied. Every
// applied snapshot is written to a cache file (atomically, mode 0600), and
// [Follower.LoadCache] applies that file at startup, so a proxy restarted
// while the control plane is down still serves.
//
// Snapshots carry the etcd revision of their config. Within one etcd
// cluster an older revision than the one running is not applied (a lagging
// replica cannot roll a node back), and identical content is a no-op. A
// snapshot that fails to compile or apply is NACKed and the old one keeps
// serving. Virtual keys arrive as digests: the data plane must use the same
// key pepper as the control plane, and a snapshot whose pepper fingerprint
// differs is NACKed rather than silently locking every key out.
//
// # Concurrency and lifecycle
//
// [Follower.Run] owns the follower until its context ends; each session's
// receive goroutine is cancelled and waited for before the session
// returns. Version is safe to call from any goroutine.
package cpfollow
