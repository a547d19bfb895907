package state_test

import (
	"reflect"
	"testing"

	"rolter.dev/controlplane/internal/state"
	"rolter.dev/pkg/config"
)

// TestCORSRoundTrip: [server.cors] reaches the data planes as written,
// through etcd (Encode, Decode) and the pushed snapshot (Render, parsed by
// the data plane): allowed_origins = [] stays CORS off instead of
// becoming the default ["*"] on the way.
func TestCORSRoundTrip(t *testing.T) {
	tests := []struct {
		name, cors string
		want       config.CORS
	}{
		{"default", "", config.CORS{AllowedOrigins: []string{"*"}, AllowedHeaders: []string{"*"}, MaxAgeSecs: 600}},
		{"off", "allowed_origins = []\n", config.CORS{AllowedOrigins: []string{}, AllowedHeaders: []string{"*"}, MaxAgeSecs: 600}},
		{"listed", "allowed_origins = [\"https://a.example\", \"http://localhost:5173\"]\nallowed_headers = [\"Authorization\", \"Content-Type\"]\nmax_age_secs = 0\nallow_credentials = true\n",
			config.CORS{AllowedOrigins: []string{"https://a.example", "http://localhost:5173"}, AllowedHeaders: []string{"Authorization", "Content-Type"}, AllowCredentials: true}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			st := state.FromConfig(parse(t, "[server.cors]\n"+tc.cors), []byte("pepper-0123456789"))
			enc, err := st.Encode()
			if err != nil {
				t.Fatal(err)
			}
			stored, err := state.Decode(enc)
			if err != nil {
				t.Fatal(err)
			}
			out, _, err := stored.Render(state.RenderOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if got := parse(t, string(out)).Server.CORS; !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("server.cors on the data plane = %#v, want %#v\n%s", got, tc.want, out)
			}
		})
	}
}
