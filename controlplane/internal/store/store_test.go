package store_test

import (
	"log/slog"
	"sync"
	"testing"

	"go.uber.org/goleak"

	"rolter.dev/controlplane/internal/etcdtest"
	"rolter.dev/controlplane/internal/state"
	"rolter.dev/controlplane/internal/store"
	"rolter.dev/pkg/config"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func route(model string, weight int) config.Route {
	return config.Route{Model: model, Strategy: "round_robin", Targets: []config.Target{{Provider: "a", Weight: &weight}}}
}

func TestUpdate(t *testing.T) {
	cli := etcdtest.Start(t)
	s := store.New(cli, store.NewLayout(""), "test", slog.New(slog.DiscardHandler))
	put := func(r config.Route, expect map[state.ID]int64) (*state.State, error) {
		return s.Update(t.Context(), store.UpdateOptions{}, func(cur *state.State) (*state.State, map[state.ID]int64, error) {
			next := cur.Clone()
			if len(next.Providers) == 0 {
				next.PutProvider(config.Provider{Name: "a", Kind: "openai_compatible", APIBase: "http://a"})
			}
			next.PutRoute(r)
			return next, expect, next.Check()
		})
	}
	first, err := put(route("m", 1), nil)
	if err != nil {
		t.Fatal(err)
	}
	id := state.ID{Kind: state.KindRoute, Name: "m"}
	if m := first.Meta[id]; m.ModRevision != first.Revision || m.CreateRevision != first.Revision {
		t.Errorf("meta %+v at revision %d", m, first.Revision)
	}
	same, err := put(route("m", 1), nil)
	if err != nil || same.Revision != first.Revision {
		t.Errorf("an unchanged write bumped the revision: %d → %d (%v)", first.Revision, same.Revision, err)
	}

	// Many writers on one object with the same expected revision: one wins.
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for i := range 8 {
		wg.Go(func() {
			_, err := put(route("m", i+2), map[state.ID]int64{id: first.Revision})
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	won := 0
	for err := range errs {
		var conflict *store.ConflictError
		switch {
		case err == nil:
			won++
		case !errorsAs(err, &conflict) || conflict.ID != id || conflict.Expected != first.Revision:
			t.Errorf("unexpected: %v", err)
		}
	}
	if won != 1 {
		t.Errorf("%d writers won", won)
	}

	// Writers on different objects never conflict: each retries on the
	// newer state.
	var wg2 sync.WaitGroup
	for i := range 6 {
		wg2.Go(func() {
			if _, err := put(route(string(rune('n'+i)), 1), nil); err != nil {
				t.Errorf("independent write: %v", err)
			}
		})
	}
	wg2.Wait()
	ld, err := s.Load(t.Context())
	if err != nil || len(ld.State.Routes) != 7 {
		t.Fatalf("load: %d routes, %v", len(ld.State.Routes), err)
	}
}

func TestCorruptObject(t *testing.T) {
	cli := etcdtest.Start(t)
	l := store.NewLayout("")
	s := store.New(cli, l, "test", slog.New(slog.DiscardHandler))
	if _, err := cli.Put(t.Context(), l.Key(state.ID{Kind: state.KindRoute, Name: "bad"}), "model = 'bad'\nbogus = 1\n"); err != nil {
		t.Fatal(err)
	}
	noop := func(cur *state.State) (*state.State, map[state.ID]int64, error) { return cur.Clone(), nil, nil }
	var corrupt *store.CorruptError
	if _, err := s.Update(t.Context(), store.UpdateOptions{}, noop); !errorsAs(err, &corrupt) {
		t.Fatalf("update over a corrupt object: %v", err)
	}
	if _, err := s.Update(t.Context(), store.UpdateOptions{DropCorrupt: true}, noop); err != nil {
		t.Fatal(err)
	}
	ld, err := s.Load(t.Context())
	if err != nil || len(ld.Corrupt) != 0 {
		t.Fatalf("after a replace: %v, %v", ld.Corrupt, err)
	}
}

func TestEnsurePepper(t *testing.T) {
	cli := etcdtest.Start(t)
	s := store.New(cli, store.NewLayout(""), "test", slog.New(slog.DiscardHandler))
	if err := s.EnsurePepper(t.Context(), "aaaa"); err != nil {
		t.Fatal(err)
	}
	if err := s.EnsurePepper(t.Context(), "aaaa"); err != nil {
		t.Fatal(err)
	}
	if err := s.EnsurePepper(t.Context(), "bbbb"); err == nil {
		t.Fatal("a second pepper was accepted")
	}
}
