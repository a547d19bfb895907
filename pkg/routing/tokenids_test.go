package routing_test

import (
	"slices"
	"testing"

	"rolter.dev/pkg/routing"
)

func TestParseTokenIDs(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want []uint32
	}{
		{"plain", "1,2,3", []uint32{1, 2, 3}},
		{"spaces", " 1 , 2,3 ", []uint32{1, 2, 3}},
		{"max u32", "4294967295", []uint32{4294967295}},
		{"error: over u32 ignores all", "1,4294967296", nil},
		{"error: negative ignores all", "1,-2", nil},
		{"error: empty element ignores all", "1,,2", nil},
		{"error: junk ignores all", "1,a", nil},
		{"empty", "", nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := routing.ParseTokenIDs(tc.in); !slices.Equal(got, tc.want) {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
		})
	}
}

func FuzzParseTokenIDs(f *testing.F) {
	f.Add("1,2,3")
	f.Add(" 7 ,\t8")
	f.Add("99999999999")
	f.Fuzz(func(t *testing.T, s string) {
		ids := routing.ParseTokenIDs(s)
		if ids != nil && len(ids) == 0 {
			t.Fatal("empty non-nil list")
		}
	})
}
