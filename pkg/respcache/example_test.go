package respcache_test

import (
	"context"
	"fmt"
	"os"
	"time"

	"rolter.dev/pkg/respcache"
)

// The proxy's side of the cache: look up, on a miss forward upstream and
// store the upstream's own response, on a hit replay the entry.
func Example() {
	ctx := context.Background()
	cache := respcache.New(respcache.NewMemory(64<<20), respcache.Options{MaxEntryBytes: 1 << 20})
	req := respcache.Request{
		Path: "/v1/chat/completions",
		Body: []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`),
		TTL:  time.Minute,
	}

	l, err := cache.Lookup(ctx, req)
	if err != nil {
		return // not JSON: serve uncached
	}
	fmt.Println("first:", l.Source)
	_ = cache.Store(ctx, l, &respcache.Entry{Status: 200, ContentType: "application/json", Body: []byte(`{"reply":"hello"}`)})

	// Key order and whitespace do not matter.
	req.Body = []byte(`{ "messages": [{"content": "hi", "role": "user"}], "model": "m" }`)
	l, _ = cache.Lookup(ctx, req)
	fmt.Println("second:", l.Source)
	_ = l.Entry.WriteBody(ctx, os.Stdout)
	fmt.Println()
	// Output:
	// first: miss
	// second: exact
	// {"reply":"hello"}
}

// A streamed response reaches the client live; the recorder sees the same
// bytes after the client, and the stream is stored once it completed.
func ExampleCache_StoreStream() {
	ctx := context.Background()
	cache := respcache.New(respcache.NewMemory(64<<20), respcache.Options{})
	req := respcache.Request{
		Path:   "/v1/chat/completions",
		Body:   []byte(`{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`),
		Stream: true,
		TTL:    time.Minute,
	}
	l, _ := cache.Lookup(ctx, req)
	rec := cache.NewRecorder()
	for _, chunk := range []string{"data: {\"x\":", "1}\n\ndata: [DO", "NE]\n\n"} {
		// client.Write(chunk); flush — then:
		rec.Write([]byte(chunk))
	}
	rec.End(nil) // or the upstream read error / the client's write error
	fmt.Println(cache.StoreStream(ctx, l, 200, "text/event-stream", rec))

	l, _ = cache.Lookup(ctx, req)
	_ = l.Entry.WriteBody(ctx, os.Stdout) // flushed after each event
	// Output:
	// <nil>
	// data: {"x":1}
	//
	// data: [DONE]
}
