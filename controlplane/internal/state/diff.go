package state

import (
	"slices"
	"strings"
)

// Action is what a change does to an object.
type Action int

// The change actions.
const (
	Added Action = iota + 1
	Changed
	Removed
)

// String is the action's name.
func (a Action) String() string {
	switch a {
	case Added:
		return "added"
	case Changed:
		return "changed"
	case Removed:
		return "removed"
	}
	return "?"
}

// FieldChange is one changed leaf of an object, secrets redacted.
type FieldChange struct {
	Path          string
	Before, After string // empty when absent on that side
}

// Change is one object added, changed or removed.
type Change struct {
	ID     ID
	Action Action
	Fields []FieldChange // for Changed
}

// Diff lists the objects that differ between old and new, settings first,
// then providers, routes and keys, each in name order.
func Diff(old, new *State) []Change {
	a, b := old.Objects(), new.Objects()
	ids := make([]ID, 0, len(a)+len(b))
	for id := range a {
		ids = append(ids, id)
	}
	for id := range b {
		if _, ok := a[id]; !ok {
			ids = append(ids, id)
		}
	}
	slices.SortFunc(ids, func(x, y ID) int {
		if x.Kind != y.Kind {
			return int(x.Kind) - int(y.Kind)
		}
		return strings.Compare(x.Name, y.Name)
	})
	var out []Change
	for _, id := range ids {
		before, inOld := a[id]
		after, inNew := b[id]
		switch {
		case !inOld:
			out = append(out, Change{ID: id, Action: Added})
		case !inNew:
			out = append(out, Change{ID: id, Action: Removed})
		default:
			if f := FieldDiff(before, after); len(f) > 0 {
				out = append(out, Change{ID: id, Action: Changed, Fields: f})
			}
		}
	}
	return out
}

// FieldDiff lists the leaves that differ between two values of one object
// type, in path order, with secrets redacted.
func FieldDiff(before, after any) []FieldChange {
	fa, fb := Flatten(Tree(before)), Flatten(Tree(after))
	paths := sortedKeys(fa)
	for p := range fb {
		if _, ok := fa[p]; !ok {
			paths = append(paths, p)
		}
	}
	slices.Sort(paths)
	var out []FieldChange
	for _, p := range paths {
		x, y := fa[p], fb[p]
		if x == y {
			continue
		}
		out = append(out, FieldChange{Path: p, Before: Redact(p, x), After: Redact(p, y)})
	}
	return out
}

// Redact hides the value of a secret-bearing leaf (an inline API key) and
// shortens a key digest to the prefix shown in listings.
func Redact(path, rendered string) string {
	leaf := path[strings.LastIndex(path, ".")+1:]
	switch {
	case rendered == "" || rendered == `""`:
		return rendered
	case leaf == "api_key" || leaf == "key" || leaf == "key_pepper":
		return `"<redacted>"`
	case leaf == "key_digest" && len(rendered) > 14:
		return rendered[:13] + `…"`
	}
	return rendered
}
