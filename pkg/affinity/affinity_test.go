package affinity_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"runtime"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/zeebo/xxh3"

	"rolter.dev/pkg/affinity"
	"rolter.dev/pkg/chunkindex"
)

const (
	chat        = affinity.PathChatCompletions
	messages    = affinity.PathMessages
	responses   = affinity.PathResponses
	completions = affinity.PathCompletions
	embeddings  = affinity.PathEmbeddings
)

// ruleCase is one rule of the prompt reader. When raw is set the body gives
// no prompt and the context carries the raw body; otherwise Prompt must be
// prompt, PromptLen n, and the digest xxh3 of stream (defaulting to prompt:
// nothing but text was read).
type ruleCase struct {
	name   string
	path   string
	body   string
	raw    bool
	prompt string
	n      int    // 0: len(prompt)
	stream string // "": prompt
}

const img = `{"type":"image_url","image_url":{"url":"data:image/png;base64,iVBOR"}}`

var ruleCases = []ruleCase{
	// Chat completions: turns(messages).
	{name: "chat turns", path: chat,
		body:   `{"model":"m","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hi"}]}`,
		prompt: "system: Be brief.\nuser: Hi\n"},
	{name: "chat missing messages", path: chat, body: `{"model":"m","prompt":"x"}`, raw: true},
	{name: "chat empty messages", path: chat, body: `{"model":"m","messages":[]}`, raw: true},
	{name: "chat messages not an array", path: chat, body: `{"messages":"hi"}`, raw: true},
	{name: "role missing", path: chat, body: `{"messages":[{"content":"hi"}]}`, prompt: "item: hi\n"},
	{name: "role not a string", path: chat, body: `{"messages":[{"role":42,"content":"hi"}]}`, prompt: "item: hi\n"},
	{name: "content null is present", path: chat, body: `{"messages":[{"role":"assistant","content":null}]}`, prompt: "assistant: \n"},
	{name: "content number gives no text", path: chat, body: `{"messages":[{"role":"user","content":7}]}`, prompt: "user: \n"},
	{name: "content parts", path: chat,
		body:   `{"messages":[{"role":"user","content":[{"type":"text","text":"a"},"b",{"type":"text","text":"c"},7,null,[1]]}]}`,
		prompt: "user: abc\n"},
	{name: "image part: digest only", path: chat,
		body:   `{"messages":[{"role":"user","content":[{"type":"text","text":"look"},` + img + `]}]}`,
		prompt: "user: look\n", stream: "user: look" + img + "\n"},
	{name: "text part with non-string text goes to push_part", path: chat,
		body:   `{"messages":[{"role":"user","content":[{"type":"text","text":null}]}]}`,
		prompt: "user: \n", stream: `user: {"type":"text","text":null}` + "\n"},
	{name: "tool_calls arguments measured", path: chat,
		body:   `{"messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{\"x\":1}"}}]}]}`,
		prompt: "assistant: \n", n: len("assistant: \n") + len(`{"x":1}`), stream: "assistant: \n" + `{"x":1}`},
	{name: "tool_calls object arguments as compact JSON", path: chat,
		body:   `{"messages":[{"role":"assistant","content":"","tool_calls":[{"function":{"arguments": { "x" : [ 1 , 2 ] } }}]}]}`,
		prompt: "assistant: \n", n: len("assistant: \n") + len(`{"x":[1,2]}`), stream: "assistant: \n" + `{"x":[1,2]}`},
	{name: "tool call without function arguments: the whole call", path: chat,
		body:   `{"messages":[{"role":"assistant","content":"","tool_calls":[{"id":"c","function":{"name":"f"}},"s",5]}]}`,
		prompt: "assistant: \n", n: len("assistant: \n") + len(`{"id":"c","function":{"name":"f"}}`) + 1 + 1,
		stream: "assistant: \n" + `{"id":"c","function":{"name":"f"}}` + "s" + "5"},
	{name: "tool_calls not an array", path: chat,
		body:   `{"messages":[{"role":"assistant","content":"x","tool_calls":{"a":1}}]}`,
		prompt: "assistant: x\n"},
	{name: "tool message", path: chat,
		body:   `{"messages":[{"role":"tool","tool_call_id":"c1","content":"42"}]}`,
		prompt: "tool: 42\n"},
	{name: "message without content: the item itself, then its calls", path: chat,
		body:   `{"messages":[{"role":"user","content":"q"},{"role":"assistant","tool_calls":[{"function":{"arguments":"{}"}}]}]}`,
		prompt: "user: q\n", n: len("user: q\n") + 2,
		stream: "user: q\n" + `{"role":"assistant","tool_calls":[{"function":{"arguments":"{}"}}]}` + "{}"},
	{name: "non-object item absorbed, not measured", path: chat,
		body:   `{"messages":["hello",{"role":"user","content":"q"},[1, 2]]}`,
		prompt: "user: q\n", stream: "hello" + "user: q\n" + "[1,2]"},
	{name: "only non-object items: no prompt", path: chat, body: `{"messages":["hello"]}`, raw: true},
	{name: "content before role", path: chat,
		body:   `{"messages":[{"content":"hi","role":"user"},{"content":[{"text":"x","type":"text"}],"role":"assistant"}]}`,
		prompt: "user: hi\nassistant: x\n"},
	{name: "duplicate keys: the last wins", path: chat,
		body:   `{"messages":[{"role":"user","content":"first","content":"second","role":"assistant"}],"messages":[{"role":"user","content":"third"}]}`,
		prompt: "user: third\n"},
	{name: "duplicate content", path: chat,
		body:   `{"messages":[{"role":"user","content":"first","content":"second"}]}`,
		prompt: "user: second\n"},
	{name: "output and arguments on a chat message", path: chat,
		body:   `{"messages":[{"role":"tool","output":"o","arguments":"a"},{"role":"x","arguments":{"k":1}}]}`,
		prompt: "", n: 1 + len(`{"k":1}`), stream: "o" + `{"k":1}`},

	// Anthropic messages: system, then turns(messages).
	{name: "anthropic system string", path: messages,
		body:   `{"model":"c","max_tokens":10,"system":"S","messages":[{"role":"user","content":"Hi"}]}`,
		prompt: "system: S\nuser: Hi\n"},
	{name: "anthropic system blocks", path: messages,
		body:   `{"system":[{"type":"text","text":"S1"},{"type":"text","text":"S2","cache_control":{"type":"ephemeral"}}],"messages":[{"role":"user","content":"Hi"}]}`,
		prompt: "system: S1S2\nuser: Hi\n"},
	{name: "anthropic messages before system", path: messages,
		body:   `{"messages":[{"role":"user","content":"Hi"}],"model":"c","system":"S"}`,
		prompt: "system: S\nuser: Hi\n"},
	{name: "anthropic system null is present", path: messages,
		body:   `{"system":null,"messages":[{"role":"user","content":"Hi"}]}`,
		prompt: "system: \nuser: Hi\n"},
	{name: "anthropic missing messages", path: messages, body: `{"system":"S"}`, raw: true},
	{name: "tool_use input measured", path: messages,
		body:   `{"messages":[{"role":"assistant","content":[{"type":"text","text":"calc"},{"type":"tool_use","id":"t1","name":"calc","input":{"a": 1}}]}]}`,
		prompt: "assistant: calc\n", n: len("assistant: calc\n") + len(`{"a":1}`), stream: "assistant: calc" + `{"a":1}` + "\n"},
	{name: "tool_use without input: the part, measured", path: messages,
		body:   `{"messages":[{"role":"assistant","content":[{"type":"tool_use","id":"t1"}]}]}`,
		prompt: "assistant: \n", n: len("assistant: \n") + len(`{"type":"tool_use","id":"t1"}`),
		stream: "assistant: " + `{"type":"tool_use","id":"t1"}` + "\n"},
	{name: "tool_result string content measured", path: messages,
		body:   `{"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"42"}]}]}`,
		prompt: "user: \n", n: len("user: \n") + 2, stream: "user: 42\n"},
	{name: "tool_result blocks", path: messages,
		body: `{"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":[` +
			`{"type":"text","text":"a\u00e9"},{"type":"image","source":{"data":"QQ=="}},{"text":{"k":[true]}},"s"]}]}]}`,
		prompt: "user: \n", n: len("user: \n") + len("aé") + len(`{"k":[true]}`),
		stream: "user: " + "aé" + `{"type":"image","source":{"data":"QQ=="}}` + `{"k":[true]}` + "s" + "\n"},
	{name: "tool_result without content: the part, not measured", path: messages,
		body:   `{"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1"}]}]}`,
		prompt: "user: \n", stream: "user: " + `{"type":"tool_result","tool_use_id":"t1"}` + "\n"},
	{name: "tool_result null content measured", path: messages,
		body:   `{"messages":[{"role":"user","content":[{"type":"tool_result","content":null}]}]}`,
		prompt: "user: \n", n: len("user: \n") + 4, stream: "user: null\n"},
	{name: "tool_result content before type", path: messages,
		body:   `{"messages":[{"content":[{"content":"42","tool_use_id":"t1","type":"tool_result"}],"role":"user"}]}`,
		prompt: "user: \n", n: len("user: \n") + 2, stream: "user: 42\n"},
	{name: "document part: digest only", path: messages,
		body:   `{"messages":[{"role":"user","content":[{"type":"document","source":{"type":"base64","data":"JVBER"}}]}]}`,
		prompt: "user: \n", stream: "user: " + `{"type":"document","source":{"type":"base64","data":"JVBER"}}` + "\n"},
	{name: "part with a text string wins over its type", path: messages,
		body:   `{"messages":[{"role":"user","content":[{"type":"image","source":{},"text":"t"}]}]}`,
		prompt: "user: t\n"},

	// Responses: instructions, then input.
	{name: "responses string input", path: responses,
		body:   `{"model":"m","instructions":"I","input":"Q"}`,
		prompt: "system: I\nuser: Q\n"},
	{name: "responses input before instructions", path: responses,
		body:   `{"input":"Q","instructions":"I","model":"m"}`,
		prompt: "system: I\nuser: Q\n"},
	{name: "responses items", path: responses,
		body: `{"input":[` +
			`{"type":"message","role":"user","content":[{"type":"input_text","text":"q"}]},` +
			`{"type":"function_call","call_id":"c","name":"f","arguments":"{\"a\":1}"},` +
			`{"type":"function_call_output","call_id":"c","output":"out"},` +
			`{"type":"reasoning","id":"rs","summary":[]},` +
			`{"type":"item_reference","id":"msg"},` +
			`{"type":"mcp_call","arguments":"A","output":"O"}]}`,
		prompt: "user: q\n", n: len("user: q\n") + len(`{"a":1}`) + len("out") + len("O"),
		stream: "user: q\n" + `{"a":1}` + "out" + `{"type":"reasoning","id":"rs","summary":[]}` + `{"type":"item_reference","id":"msg"}` + "O"},
	{name: "responses missing input", path: responses, body: `{"instructions":"I"}`, raw: true},
	{name: "responses only tool outputs: empty text, still a prompt", path: responses,
		body:   `{"input":[{"type":"function_call_output","call_id":"c","output":"out"}]}`,
		prompt: "", n: 3, stream: "out"},

	// Completions and embeddings: push_text.
	{name: "completions string", path: completions, body: `{"model":"m","prompt":"Once upon"}`, prompt: "Once upon"},
	{name: "completions array of strings", path: completions, body: `{"prompt":["a","b"]}`, prompt: "ab"},
	{name: "completions token ids: no prompt", path: completions, body: `{"prompt":[1,2,3]}`, raw: true},
	{name: "completions only media: no prompt", path: completions, body: `{"prompt":[` + img + `]}`, raw: true},
	{name: "completions missing prompt", path: completions, body: `{"model":"m"}`, raw: true},
	{name: "embeddings input", path: embeddings, body: `{"model":"e","input":"vector me"}`, prompt: "vector me"},
	{name: "embeddings array", path: embeddings, body: `{"input":["a","b"]}`, prompt: "ab"},

	// Bodies with no readable prompt.
	{name: "unknown path", path: "/v1/images/generations", body: `{"prompt":"cat"}`, raw: true},
	{name: "invalid JSON", path: chat, body: `{"messages":[{"role":"user","content":"hi"}]`, raw: true},
	{name: "trailing garbage", path: chat, body: `{"messages":[{"role":"user","content":"hi"}]} x`, raw: true},
	{name: "invalid JSON in an unread field", path: chat, body: `{"messages":[{"role":"user","content":"hi"}],"x":[1,]}`, raw: true},
	{name: "invalid JSON in a delimited field", path: messages, body: `{"messages":[{"role":"user","content":"hi" "x"}],"system":"s"}`, raw: true},
	{name: "top-level array", path: chat, body: `[{"messages":[]}]`, raw: true},
	{name: "empty body", path: chat, body: ``, raw: true},

	// Escapes.
	{name: "escapes decoded", path: chat,
		body:   `{"messages":[{"role":"us\u0065r","content":"caf\u00e9 \ud83d\ude00 \ud800 \"q\" \\ \/ \n\t"}]}`,
		prompt: "user: café 😀 \uFFFD \"q\" \\ / \n\t\n"},
	{name: "escaped keys", path: chat,
		body:   `{"m\u0065ssages":[{"r\u006fle":"user","\u0063ontent":[{"t\u0079pe":"text","te\u0078t":"x"}]}]}`,
		prompt: "user: x\n"},
	{name: "invalid UTF-8 decodes to U+FFFD", path: chat,
		body:   "{\"messages\":[{\"role\":\"user\",\"content\":\"a\xffb\"}]}",
		prompt: "user: a\uFFFDb\n"},
	{name: "compact JSON re-escapes strings", path: messages,
		body:   `{"messages":[{"role":"assistant","content":[{"type":"tool_use","input":{"s":"\u00e9\u0001\"\/"}}]}]}`,
		prompt: "assistant: \n", n: len("assistant: \n") + len(`{"s":"é\u0001\"/"}`),
		stream: "assistant: " + `{"s":"é\u0001\"/"}` + "\n"},
}

func TestRules(t *testing.T) {
	for _, c := range ruleCases {
		t.Run(c.name, func(t *testing.T) {
			got := affinity.Build(c.path, []byte(c.body), nil)
			if c.raw {
				if got.HasDigest || got.PromptLen != 0 || got.Prompt != c.body {
					t.Fatalf("got %+v, want the raw body and no len/digest", got)
				}
			} else {
				n, stream := c.n, c.stream
				if n == 0 {
					n = len(c.prompt)
				}
				if stream == "" {
					stream = c.prompt
				}
				if got.Prompt != c.prompt {
					t.Errorf("Prompt = %q, want %q", got.Prompt, c.prompt)
				}
				if got.PromptLen != n {
					t.Errorf("PromptLen = %d, want %d", got.PromptLen, n)
				}
				if !got.HasDigest || got.PromptDigest != xxh3.HashString(stream) {
					t.Errorf("digest %#x (has %v), want xxh3(%q)", got.PromptDigest, got.HasDigest, stream)
				}
			}
			// Every rule case agrees with the reference too.
			sameContext(t, "reference", got, refBuild(c.path, []byte(c.body), nil))
		})
	}
}

func TestHeaders(t *testing.T) {
	h := http.Header{}
	h.Set("x-session-id", "sess-1")
	h.Set("x-rolter-vllm-token-ids", " 1, 2,3 ")
	got := affinity.Build(chat, []byte(`{"messages":[{"role":"user","content":"hi"}]}`), h)
	if got.SessionKey != "sess-1" || !slices.Equal(got.TokenIDs, []uint32{1, 2, 3}) {
		t.Fatalf("session %q, token ids %v", got.SessionKey, got.TokenIDs)
	}
	h.Set("x-rolter-vllm-token-ids", "1,x")
	if got := affinity.Build(chat, []byte(`{}`), h); got.TokenIDs != nil {
		t.Fatalf("bad token ids kept: %v", got.TokenIDs)
	}
	if got := affinity.Build(chat, []byte(`{}`), nil); got.SessionKey != "" || got.TokenIDs != nil {
		t.Fatalf("nil header: %+v", got)
	}
}

// A session key is remembered per session by the balancers (pipeline keeps
// up to 100,000): a long x-session-id (the server takes headers up to 1 MiB)
// is replaced by a fixed-size digest, so that a client cannot make a proxy
// hold 100,000 MiB, while a session still keeps one key and two sessions
// two keys.
func TestSessionKeyIsBounded(t *testing.T) {
	key := func(id string) string {
		h := http.Header{}
		h.Set("x-session-id", id)
		return affinity.Build(chat, []byte(`{}`), h).SessionKey
	}
	atMax := strings.Repeat("s", affinity.MaxSessionKey)
	long := strings.Repeat("s", 1<<20)
	tests := []struct {
		name, id string
		same     bool // kept as it is
	}{
		{"short", "sess-1", true},
		{"at the bound", atMax, true},
		{"one past it", atMax + "x", false},
		{"1 MiB", long, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := key(tc.id)
			if len(got) > affinity.MaxSessionKey || got == "" {
				t.Fatalf("session key of %d bytes", len(got))
			}
			if (got == tc.id) != tc.same {
				t.Fatalf("session key %q for an id of %d bytes", got, len(tc.id))
			}
			if key(tc.id) != got {
				t.Fatal("one session, two keys")
			}
		})
	}
	if key(long) == key(long[1:]+"t") || key(long) == key(atMax+"x") {
		t.Fatal("two long sessions share a key")
	}
}

func TestInvalidUTF8RawBody(t *testing.T) {
	got := affinity.Build(chat, []byte("\xff{"), nil)
	if got.Prompt != "" || got.HasDigest {
		t.Fatalf("got %+v", got)
	}
}

// equal reports whether two contexts carry the same prompt, len and digest.
func equal(a, b []byte, path string) (string, string, bool) {
	x, y := affinity.Build(path, a, nil), affinity.Build(path, b, nil)
	return fmt.Sprintf("%q %d %#x", x.Prompt, x.PromptLen, x.PromptDigest),
		fmt.Sprintf("%q %d %#x", y.Prompt, y.PromptLen, y.PromptDigest),
		x.Prompt == y.Prompt && x.PromptLen == y.PromptLen && x.PromptDigest == y.PromptDigest && x.HasDigest && y.HasDigest
}

func TestSameContext(t *testing.T) {
	for _, c := range []struct {
		name, path, a, b string
	}{
		{"the envelope is not part of the prompt", chat,
			`{"model":"gpt-4o","temperature":0.2,"messages":[{"role":"user","content":"hi"}]}`,
			`{"model":"llama-3","temperature":1,"stream":true,"max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`},
		{"whitespace in values does not change the digest", messages,
			`{"messages":[{"role":"assistant","content":[{"type":"tool_use","input":{"a":[1,2],"b":{"c":"d"}}},` + img + `]}]}`,
			"{ \"messages\" : [ { \"role\" : \"assistant\" , \"content\" : [ { \"type\" : \"tool_use\" , \"input\" : {\n\t\"a\" : [ 1 ,\r\n 2 ] , \"b\" : { \"c\" : \"d\" } } } ,\n" +
				`{ "type" : "image_url" , "image_url" : { "url" : "data:image/png;base64,iVBOR" } } ] } ] }`},
		{"escapes decoded", chat,
			`{"messages":[{"role":"user","content":"\u00e9t\u00e9 \"\u00e9\""}]}`,
			`{"messages":[{"role":"user","content":"été \"é\""}]}`},
		{"escapes inside compact JSON", messages,
			`{"messages":[{"role":"user","content":[{"type":"tool_result","content":{"k":"\u00e9\/"}}]}]}`,
			`{"messages":[{"role":"user","content":[{"type":"tool_result","content":{"k":"é/"}}]}]}`},
		{"responses input as a string or as items", responses,
			`{"instructions":"be kind","input":"hello"}`,
			`{"instructions":"be kind","input":[{"role":"user","content":"hello"}]}`},
		{"anthropic system as a string or as blocks", messages,
			`{"system":"You are terse.","messages":[{"role":"user","content":"hi"}]}`,
			`{"system":[{"type":"text","text":"You are "},{"type":"text","text":"terse.","cache_control":{"type":"ephemeral"}}],"messages":[{"role":"user","content":"hi"}]}`},
		{"field order does not matter", messages,
			`{"system":"S","messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":"r"}]}]}`,
			`{"messages":[{"content":[{"content":"r","type":"tool_result","tool_use_id":"t"}],"role":"user"}],"system":"S"}`},
		{"pretty-printed body", chat,
			`{"messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"c","function":{"name":"f","arguments":{"x":[1,{"y":null}]}}}]}]}`,
			indent(`{"messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"c","function":{"name":"f","arguments":{"x":[1,{"y":null}]}}}]}]}`)},
	} {
		t.Run(c.name, func(t *testing.T) {
			if x, y, ok := equal([]byte(c.a), []byte(c.b), c.path); !ok {
				t.Fatalf("contexts differ:\n%s\n%s", x, y)
			}
		})
	}
}

func indent(s string) string {
	var buf bytes.Buffer
	if err := json.Indent(&buf, []byte(s), "", "    "); err != nil {
		panic(err)
	}
	return buf.String()
}

func TestConversationExtendsItsPrefix(t *testing.T) {
	turn1 := `{"model":"m","messages":[{"role":"system","content":"You are a pirate."},{"role":"user","content":"Ahoy?"}]}`
	turn2 := `{"model":"m","temperature":0.7,"messages":[{"role":"system","content":"You are a pirate."},{"role":"user","content":"Ahoy?"},` +
		`{"role":"assistant","content":"Arr."},{"role":"user","content":"Where's the gold?"}]}`
	a := affinity.Build(chat, []byte(turn1), nil)
	b := affinity.Build(chat, []byte(turn2), nil)
	if !strings.HasPrefix(b.Prompt, a.Prompt) || len(b.Prompt) <= len(a.Prompt) {
		t.Fatalf("turn 2 %q does not extend turn 1 %q", b.Prompt, a.Prompt)
	}
	if a.PromptDigest == b.PromptDigest {
		t.Fatal("turns share a digest")
	}
}

func TestToolResultsChangeDigestAndLenNotText(t *testing.T) {
	mk := func(result string) []byte {
		return fmt.Appendf(nil, `{"messages":[{"role":"user","content":[{"type":"text","text":"run it"},`+
			`{"type":"tool_result","tool_use_id":"t","content":%q}]}]}`, result)
	}
	a := affinity.Build(messages, mk("ok"), nil)
	b := affinity.Build(messages, mk("a much longer result"), nil)
	if a.Prompt != b.Prompt || a.Prompt != "user: run it\n" {
		t.Fatalf("texts %q %q", a.Prompt, b.Prompt)
	}
	if a.PromptDigest == b.PromptDigest || b.PromptLen-a.PromptLen != len("a much longer result")-len("ok") {
		t.Fatalf("a %+v b %+v", a, b)
	}
}

func TestImageChangesDigestOnly(t *testing.T) {
	mk := func(data string) []byte {
		return fmt.Appendf(nil, `{"messages":[{"role":"user","content":[{"type":"text","text":"what is this"},`+
			`{"type":"image_url","image_url":{"url":"data:image/png;base64,%s"}}]}]}`, data)
	}
	a := affinity.Build(chat, mk("AAAA"), nil)
	b := affinity.Build(chat, mk("BBBBBBBBBBBB"), nil)
	if a.Prompt != b.Prompt || a.PromptLen != b.PromptLen || a.PromptDigest == b.PromptDigest {
		t.Fatalf("a %+v b %+v", a, b)
	}
}

// TestLongPromptCut puts characters of every width across the 32 KiB mark.
func TestLongPromptCut(t *testing.T) {
	for _, ch := range []string{"é", "中", "😀"} {
		for shift := range 5 {
			// "user: " + filler puts ch at MaxBytes-shift.
			filler := strings.Repeat("a", affinity.MaxBytes-len("user: ")-shift)
			content := filler + strings.Repeat(ch, 8) + "tail"
			body := fmt.Appendf(nil, `{"messages":[{"role":"user","content":%q},{"role":"assistant","content":"x"}]}`, content)
			got := affinity.Build(chat, body, nil)
			whole := "user: " + content + "\nassistant: x\n"
			if !utf8.ValidString(got.Prompt) || len(got.Prompt) > affinity.MaxBytes || len(got.Prompt) < affinity.MaxBytes-3 {
				t.Fatalf("%s shift %d: prompt of %d bytes, valid %v", ch, shift, len(got.Prompt), utf8.ValidString(got.Prompt))
			}
			if !strings.HasPrefix(whole, got.Prompt) {
				t.Fatalf("%s shift %d: prompt is not a prefix of the whole text", ch, shift)
			}
			if got.PromptLen != len(whole) || got.PromptDigest != xxh3.HashString(whole) {
				t.Fatalf("%s shift %d: len %d digest %#x, want %d %#x", ch, shift,
					got.PromptLen, got.PromptDigest, len(whole), xxh3.HashString(whole))
			}
			if got.PromptChain.Len != len(whole) || !slices.Equal(got.PromptChain.Hashes, chunkindex.Hashes(nil, whole)) {
				t.Fatalf("%s shift %d: chain of %d bytes, want the whole text's %d", ch, shift, got.PromptChain.Len, len(whole))
			}
		}
	}
}

// A builder that parsed a very long prompt goes back to the pool without
// its grown fingerprint buffer (affinity's recycle); the contexts built
// after it, long or short, carry their own prompt's chain all the same.
func TestChainAfterAVeryLongPrompt(t *testing.T) {
	for _, n := range []int{4 << 20, affinity.MaxBytes + 100, 1 << 20, 200, 3 << 20} {
		content := strings.Repeat("abcdefghij", n/10)
		body := fmt.Appendf(nil, `{"messages":[{"role":"user","content":%q}]}`, content)
		got := affinity.Build(chat, body, nil)
		whole := "user: " + content + "\n"
		if n < affinity.MaxBytes {
			if got.Prompt != whole || len(got.PromptChain.Hashes) != 0 {
				t.Fatalf("%d bytes: prompt of %d bytes and a chain of %d hashes, want the whole text and no chain", n, len(got.Prompt), len(got.PromptChain.Hashes))
			}
			continue
		}
		if got.PromptChain.Len != len(whole) || !slices.Equal(got.PromptChain.Hashes, chunkindex.Hashes(nil, whole)) {
			t.Fatalf("%d bytes: chain of %d bytes, %d hashes; want the whole text's %d", n, got.PromptChain.Len, len(got.PromptChain.Hashes), len(whole))
		}
	}
}

// TestNothingAfterTheCut: once a piece is cut, a later piece is not appended
// even when it would fit in the room the cut left.
func TestNothingAfterTheCut(t *testing.T) {
	// The content ends with "é" straddling the limit by one byte: the cut
	// leaves one byte of room, which the "\n" after the content would fill.
	content := strings.Repeat("a", affinity.MaxBytes-len("user: ")-1) + "é"
	body := fmt.Appendf(nil, `{"messages":[{"role":"user","content":%q}]}`, content)
	got := affinity.Build(chat, body, nil)
	want := "user: " + content[:len(content)-2]
	if got.Prompt != want {
		t.Fatalf("prompt ends %q, want it to end %q", got.Prompt[len(got.Prompt)-4:], want[len(want)-4:])
	}
	if got.PromptLen != len("user: ")+len(content)+1 {
		t.Fatalf("len %d", got.PromptLen)
	}
}

// TestRawFallbackCut: the raw body fallback is cut on a character boundary.
func TestRawFallbackCut(t *testing.T) {
	body := []byte(`{"model":"m","x":"` + strings.Repeat("中", affinity.MaxBytes) + `"}`)
	got := affinity.Build(chat, body, nil)
	if len(got.Prompt) > affinity.MaxBytes || !utf8.ValidString(got.Prompt) || !bytes.HasPrefix(body, []byte(got.Prompt)) ||
		len(got.Prompt) < affinity.MaxBytes-2 || got.HasDigest || got.PromptLen != 0 {
		t.Fatalf("raw fallback of %d bytes, valid %v", len(got.Prompt), utf8.ValidString(got.Prompt))
	}
}

// TestHugeToolResultIsNotCopied: a 4 MiB tool result costs the same number
// of allocations as a tiny one.
func TestHugeToolResultIsNotCopied(t *testing.T) {
	mk := func(n int) []byte {
		return fmt.Appendf(nil, `{"system":"S","messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":[{"type":"text","text":%q}]}]}]}`,
			strings.Repeat("log line\n", n/9))
	}
	small, huge := mk(64), mk(4<<20)
	// Bytes, not allocation counts: a GC during the runs empties the
	// builder pool and refills cost an allocation (more GCs run while the
	// huge body is walked, so counts differ by chance), but a copy of the
	// tool result would cost 4 MiB a run.
	perRun := func(body []byte) uint64 {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		for range 20 {
			affinity.Build(messages, body, nil)
		}
		runtime.ReadMemStats(&after)
		return (after.TotalAlloc - before.TotalAlloc) / 20
	}
	affinity.Build(messages, huge, nil) // warm the pool
	if a, b := perRun(small), perRun(huge); b > 256<<10 {
		t.Fatalf("allocated %d bytes a run for a small body, %d for a 4 MiB one", a, b)
	}
	got := affinity.Build(messages, huge, nil)
	if got.Prompt != "system: S\nuser: \n" || got.PromptLen < 4<<20 {
		t.Fatalf("prompt %q len %d", got.Prompt, got.PromptLen)
	}
}

// TestDeepNesting: encoding/json's depth limit holds, and deep bodies do not
// exhaust anything.
func TestDeepNesting(t *testing.T) {
	for _, depth := range []int{100, 9990, 10000, 10001, 200000} {
		inner := strings.Repeat("[", depth-4) + strings.Repeat("]", depth-4)
		body := []byte(`{"messages":[{"role":"user","content":[{"type":"image","x":` + inner + `}]}]}`)
		got := affinity.Build(messages, body, nil)
		want := refBuild(messages, body, nil)
		sameContext(t, fmt.Sprint("depth ", depth), got, want)
		if got.HasDigest != json.Valid(body) {
			t.Fatalf("depth %d: has digest %v, valid %v", depth, got.HasDigest, json.Valid(body))
		}
	}
}

// TestBuildSalted: a salted request's prompt reads as its salt's line and
// then the conversation, in the text, the digest and (past the cut) the
// chain, so that prompts share prefixes only with their own salt; its
// measured length is the conversation's. No salt is Build.
func TestBuildSalted(t *testing.T) {
	for _, n := range []int{20, affinity.MaxBytes + 100} {
		content := strings.Repeat("abcdefghij", n/10)
		body := fmt.Appendf(nil, `{"messages":[{"role":"user","content":%q}]}`, content)
		whole := "user: " + content + "\n"
		if got, want := affinity.BuildSalted(chat, body, nil, ""), affinity.Build(chat, body, nil); got.Prompt != want.Prompt ||
			got.PromptDigest != want.PromptDigest || got.PromptLen != want.PromptLen || !slices.Equal(got.PromptChain.Hashes, want.PromptChain.Hashes) {
			t.Fatalf("%d bytes: no salt differs from Build", n)
		}
		var prompts []string
		for _, salt := range []string{"tenant-a", "tenant-b", "tenant-a"} {
			got := affinity.BuildSalted(chat, body, nil, salt)
			salted := "\x00cache_salt\x00" + salt + "\n" + whole
			if got.PromptLen != len(whole) || got.PromptDigest != xxh3.HashString(salted) || !strings.HasPrefix(salted, got.Prompt) {
				t.Fatalf("%d bytes, salt %s: len %d, digest %#x, prompt %.40q; want %d, %#x and a prefix of %.40q",
					n, salt, got.PromptLen, got.PromptDigest, got.Prompt, len(whole), xxh3.HashString(salted), salted)
			}
			if n > affinity.MaxBytes && !slices.Equal(got.PromptChain.Hashes, chunkindex.Hashes(nil, salted)) {
				t.Fatalf("salt %s: the chain is not the salted text's", salt)
			}
			prompts = append(prompts, got.Prompt)
		}
		if prompts[0] == prompts[1] || prompts[0] != prompts[2] {
			t.Fatalf("%d bytes: the salts' prompts equal %v and %v, want false and true", n, prompts[0] == prompts[1], prompts[0] == prompts[2])
		}
	}
}
