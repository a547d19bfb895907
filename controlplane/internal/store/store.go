package store

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"rolter.dev/controlplane/internal/state"
)

// Store reads and writes the config in etcd. Safe for concurrent use; it
// holds no state of its own beyond the client.
type Store struct {
	cli    *clientv3.Client
	layout Layout
	writer string
	log    *slog.Logger
}

// New returns a store over cli. writer names this replica in the marker.
func New(cli *clientv3.Client, layout Layout, writer string, log *slog.Logger) *Store {
	return &Store{cli: cli, layout: layout, writer: writer, log: log.With("component", "store")}
}

// Layout returns the key layout.
func (s *Store) Layout() Layout { return s.layout }

// ConflictError reports that an object was not at the revision a write
// expected: another writer changed or deleted it first.
type ConflictError struct {
	ID       state.ID
	Expected int64
	Actual   int64 // 0 when the object no longer exists
}

func (e *ConflictError) Error() string {
	if e.Actual == 0 {
		return fmt.Sprintf("%s was deleted by another writer (expected revision %d)", e.ID, e.Expected)
	}
	return fmt.Sprintf("%s was changed by another writer: expected revision %d, it is now at %d; read it again and retry", e.ID, e.Expected, e.Actual)
}

// ErrContention is returned when a write lost the race against other
// writers too many times in a row.
var ErrContention = errors.New("store: too many concurrent config changes; retry")

// EtcdError is a failed etcd call: etcd unreachable, no leader, a timeout.
type EtcdError struct {
	Op  string
	Err error
}

func (e *EtcdError) Error() string { return "store: " + e.Op + ": " + e.Err.Error() }
func (e *EtcdError) Unwrap() error { return e.Err }

// CorruptError reports stored objects that do not decode.
type CorruptError struct{ Err error }

func (e *CorruptError) Error() string { return "store: stored config is corrupt: " + e.Err.Error() }
func (e *CorruptError) Unwrap() error { return e.Err }

// Loaded is a state as read, with the raw keys it came from.
type Loaded struct {
	State *state.State
	// Corrupt lists keys whose values do not decode (their objects are
	// missing from State).
	Corrupt []string
}

// Load reads the config at the current revision (a linearizable read).
func (s *Store) Load(ctx context.Context) (*Loaded, error) {
	resp, err := s.cli.Get(ctx, s.layout.ConfigPrefix(), clientv3.WithPrefix())
	if err != nil {
		return nil, &EtcdError{Op: "read config", Err: err}
	}
	ld := s.layout.Decode(resp.Kvs, resp.Header.ClusterId, s.log)
	return ld, nil
}

// Decode builds a state from the key-values under the config prefix. Keys
// that do not parse or decode are reported in Loaded.Corrupt and logged.
func (l Layout) Decode(kvs []*mvccpb.KeyValue, clusterID uint64, log *slog.Logger) *Loaded {
	objs := make(map[state.ID][]byte, len(kvs))
	meta := make(map[state.ID]state.Meta, len(kvs))
	keyOf := make(map[state.ID]string, len(kvs))
	var rev int64
	var corrupt []string
	for _, kv := range kvs {
		id, err := l.Parse(string(kv.Key))
		if errors.Is(err, ErrNotObject) {
			rev = kv.ModRevision
			continue
		}
		if err != nil {
			log.Warn("ignoring unknown key under the config prefix", "key", string(kv.Key), "err", err)
			continue
		}
		objs[id] = kv.Value
		meta[id] = state.Meta{CreateRevision: kv.CreateRevision, ModRevision: kv.ModRevision}
		keyOf[id] = string(kv.Key)
	}
	st, err := state.Decode(objs)
	if err != nil {
		// Decode again without the bad objects so the rest is usable.
		for id, b := range objs {
			if _, e := state.Decode(map[state.ID][]byte{id: b}); e != nil {
				delete(objs, id)
				delete(meta, id)
				corrupt = append(corrupt, keyOf[id])
				log.Error("stored object does not decode", "key", keyOf[id], "err", e)
			}
		}
		st, _ = state.Decode(objs)
	}
	st.Revision = rev
	st.ClusterID = clusterID
	st.Meta = meta
	return &Loaded{State: st, Corrupt: corrupt}
}

// Mutation computes the next state from the current one. It must not
// change cur (use cur.Clone()). It returns the next state and, for writes
// that were given an expected object revision, those expectations; a
// returned error aborts the update unchanged.
type Mutation func(cur *state.State) (next *state.State, expect map[state.ID]int64, err error)

// UpdateOptions tunes [Store.Update].
type UpdateOptions struct {
	// DropCorrupt deletes stored objects that do not decode (Apply, which
	// replaces everything, sets it); otherwise they make the update fail.
	DropCorrupt bool
}

const maxAttempts = 8

// Update runs an optimistic transaction: read the config at revision R,
// compute the next state with m, and write the objects that differ in one
// txn that succeeds only if the config is still at R and every expected
// object revision holds. When another write won the race, m runs again on
// the new state; when an expected revision no longer holds, the result is
// a [*ConflictError]. It returns the written state with its new revisions
// (the current one, unchanged, when nothing differed).
func (s *Store) Update(ctx context.Context, opts UpdateOptions, m Mutation) (*state.State, error) {
	for range maxAttempts {
		ld, err := s.Load(ctx)
		if err != nil {
			return nil, err
		}
		if len(ld.Corrupt) > 0 && !opts.DropCorrupt {
			return nil, &CorruptError{Err: fmt.Errorf("undecodable keys %q; replace the whole config with Apply", ld.Corrupt)}
		}
		cur := ld.State
		next, expect, err := m(cur)
		if err != nil {
			return nil, err
		}
		for id, rev := range expect {
			if got := cur.Meta[id].ModRevision; got != rev {
				return nil, &ConflictError{ID: id, Expected: rev, Actual: got}
			}
		}
		ops, written, err := s.ops(cur, next, ld.Corrupt)
		if err != nil {
			return nil, err
		}
		if len(ops) == 0 {
			return cur, nil
		}
		ops = append(ops, clientv3.OpPut(s.layout.Marker(), s.writer))
		cmps := []clientv3.Cmp{s.markerCmp(cur.Revision)}
		for id, rev := range expect {
			cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(s.layout.Key(id)), "=", rev))
		}
		resp, err := s.cli.Txn(ctx).If(cmps...).Then(ops...).Commit()
		if err != nil {
			return nil, &EtcdError{Op: "write config", Err: err}
		}
		if !resp.Succeeded {
			s.log.Debug("config changed during a write; retrying", "revision", cur.Revision)
			continue
		}
		rev := resp.Header.Revision
		next = next.Clone()
		next.Revision = rev
		next.ClusterID = resp.Header.ClusterId
		for id, deleted := range written {
			if deleted {
				delete(next.Meta, id)
				continue
			}
			m := next.Meta[id]
			if m.CreateRevision == 0 {
				m.CreateRevision = rev
			}
			m.ModRevision = rev
			next.Meta[id] = m
		}
		return next, nil
	}
	return nil, ErrContention
}

func (s *Store) markerCmp(rev int64) clientv3.Cmp {
	if rev == 0 {
		return clientv3.Compare(clientv3.CreateRevision(s.layout.Marker()), "=", 0)
	}
	return clientv3.Compare(clientv3.ModRevision(s.layout.Marker()), "=", rev)
}

// ops lists the puts and deletes that turn cur into next. written maps each
// touched object to whether it is deleted.
func (s *Store) ops(cur, next *state.State, corrupt []string) ([]clientv3.Op, map[state.ID]bool, error) {
	a, err := cur.Encode()
	if err != nil {
		return nil, nil, err
	}
	b, err := next.Encode()
	if err != nil {
		return nil, nil, err
	}
	var ops []clientv3.Op
	written := map[state.ID]bool{}
	for id, v := range b {
		old, ok := a[id]
		if ok && bytes.Equal(old, v) {
			continue
		}
		// An absent settings key means the defaults, which Encode
		// renders, so an unchanged default is not written either.
		ops = append(ops, clientv3.OpPut(s.layout.Key(id), string(v)))
		written[id] = false
	}
	for id := range a {
		if _, ok := b[id]; !ok {
			ops = append(ops, clientv3.OpDelete(s.layout.Key(id)))
			written[id] = true
		}
	}
	for _, k := range corrupt {
		ops = append(ops, clientv3.OpDelete(k))
	}
	return ops, written, nil
}

// EnsurePepper records the fingerprint of the key pepper on first use and
// afterwards refuses a different one: keys minted under one pepper do not
// authenticate under another.
func (s *Store) EnsurePepper(ctx context.Context, check string) error {
	key := s.layout.PepperCheck()
	resp, err := s.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, check)).
		Else(clientv3.OpGet(key)).Commit()
	if err != nil {
		return &EtcdError{Op: "check key pepper", Err: err}
	}
	if resp.Succeeded {
		return nil
	}
	kvs := resp.Responses[0].GetResponseRange().Kvs
	if len(kvs) == 1 && string(kvs[0].Value) != check {
		return fmt.Errorf("store: the key pepper differs from the one the stored keys were made with "+
			"(fingerprint %s, stored %s at %s); use the same ROLTER_KEY_PEPPER on every control plane", check, kvs[0].Value, key)
	}
	return nil
}
