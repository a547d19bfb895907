package tokenize_test

import (
	"bytes"
	"encoding/json"
	"os/exec"
	"strings"
	"testing"

	"rolter.dev/dataplane/internal/tokenize"
)

// TestBuildMessages: an Anthropic Messages body becomes the chat messages
// vLLM converts it to (messages.go cites the source), or nothing when that
// conversion is not reproduced exactly.
func TestBuildMessages(t *testing.T) {
	const tail = `,"add_generation_prompt":true,"add_special_tokens":false}`
	for _, tc := range []struct {
		name, body string
		want       string // the /tokenize body; "" when not tokenized
	}{
		{"system and a string, sampling fields left out",
			`{"model":"p","max_tokens":5,"system":"be brief","messages":[{"role":"user","content":"hi"}],"stream":true,"temperature":0,"metadata":{"user_id":"u"}}`,
			`{"model":"m","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi"}]` + tail},
		{"system blocks joined with nothing, the billing header and empty texts left out, system messages after them",
			`{"system":[{"type":"text","text":"x-anthropic-billing-header: cch=1;"},{"type":"text","text":"a","cache_control":{"type":"ephemeral"}},{"type":"text","text":""},{"type":"text","text":"b\n"}],` +
				`"messages":[{"role":"system","content":"c"},{"role":"user","content":[{"type":"text","text":"q"}]},{"role":"system","content":[{"type":"text","text":"d"}]}]}`,
			`{"model":"m","messages":[{"role":"system","content":"ab\ncd"},{"role":"user","content":"q"}]` + tail},
		{"an empty system adds no message", `{"system":"","messages":[{"role":"user","content":"hi"}]}`,
			`{"model":"m","messages":[{"role":"user","content":"hi"}]` + tail},
		{"text parts, thinking, tool use and its result",
			`{"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":""},{"type":"text","text":"b"}]},` +
				`{"role":"assistant","content":[{"type":"thinking","thinking":"t1","signature":"s"},{"type":"redacted_thinking","data":"x"},{"type":"thinking","thinking":"t2"},{"type":"text","text":"calling"},` +
				`{"type":"tool_use","id":"toolu_1","name":"get","input":{"city":"Paris","n":2,"deep":{"ok":true,"v":null,"l":[1,"é"]}}}]},` +
				`{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":[{"type":"text","text":"18C"},{"type":"text","text":"sunny"}]},{"type":"text","text":"and tomorrow?"}]}]}`,
			`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},` +
				`{"role":"assistant","reasoning":"t1t2","tool_calls":[{"id":"toolu_1","type":"function","function":{"name":"get","arguments":"{\"city\": \"Paris\", \"n\": 2, \"deep\": {\"ok\": true, \"v\": null, \"l\": [1, \"\\u00e9\"]}}"}}],"content":"calling"},` +
				`{"role":"tool","tool_call_id":"toolu_1","content":"18C\nsunny"},{"role":"user","content":"and tomorrow?"}]` + tail},
		{"a tool result alone leaves no user message; a tool use alone no content",
			`{"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":[{"type":"tool_use","id":"t","name":"f","input":{}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":"ok"}]}]}`,
			`{"model":"m","messages":[{"role":"user","content":"hi"},{"role":"assistant","tool_calls":[{"id":"t","type":"function","function":{"name":"f","arguments":"{}"}}]},{"role":"tool","tool_call_id":"t","content":"ok"}]` + tail},
		{"an assistant's tool result is text; an empty assistant message stays",
			`{"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":[{"type":"tool_result","content":"x"},{"type":"text","text":"y"}]},{"role":"assistant","content":[{"type":"text","text":""}]},{"role":"user","content":[]}]}`,
			`{"model":"m","messages":[{"role":"user","content":"hi"},{"role":"assistant","content":[{"type":"text","text":"Tool result: x"},{"type":"text","text":"y"}]},{"role":"assistant"}]` + tail},
		{"tools, their schema typed, and the template's kwargs",
			`{"messages":[{"role":"user","content":"hi"}],"tools":[{"name":"a","description":"d","input_schema":{"type":"object","properties":{}}},{"name":"b","input_schema":{},"defer_loading":true},{"name":"c","input_schema":{"properties":{"x":{}}}}],"tool_choice":{"type":"any"},"chat_template_kwargs":{"enable_thinking":false}}`,
			`{"model":"m","messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"a","description":"d","parameters":{"type":"object","properties":{}}}},` +
				`{"type":"function","function":{"name":"b","parameters":{"type":"object"},"defer_loading":true}},{"type":"function","function":{"name":"c","parameters":{"properties":{"x":{}},"type":"object"}}}],"chat_template_kwargs":{"enable_thinking":false}` + tail},
		{"strings as the client wrote them", `{"messages":[{"role":"user","content":"caf\u00e9 \ud800"}]}`,
			`{"model":"m","messages":[{"role":"user","content":"caf\u00e9 \ud800"}]` + tail},
		{"an image", `{"messages":[{"role":"user","content":[{"type":"image","source":{"type":"url","url":"http://x"}},{"type":"text","text":"what?"}]}]}`, ""},
		{"a document", `{"messages":[{"role":"user","content":[{"type":"document","source":{}}]}]}`, ""},
		{"a tool reference", `{"messages":[{"role":"user","content":[{"type":"tool_reference","tool_name":"f"}]}]}`, ""},
		{"an image in a tool result", `{"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":[{"type":"image","source":{}}]}]}]}`, ""},
		{"a tool use without an id", `{"messages":[{"role":"assistant","content":[{"type":"tool_use","name":"f","input":{}}]}]}`, ""},
		{"a tool input with a float", `{"messages":[{"role":"assistant","content":[{"type":"tool_use","id":"t","name":"f","input":{"x":1.5}}]}]}`, ""},
		{"an assistant's tool result as a list", `{"messages":[{"role":"assistant","content":[{"type":"tool_result","content":[{"type":"text","text":"x"}]}]}]}`, ""},
		{"joined texts with a surrogate escape", `{"system":[{"type":"text","text":"a\ud800"},{"type":"text","text":"b"}],"messages":[{"role":"user","content":"hi"}]}`, ""},
		{"an effort is the chat completion's reasoning effort", `{"messages":[{"role":"user","content":"hi"}],"output_config":{"effort":"low","format":null},"chat_template_kwargs":{"x":1}}`,
			`{"model":"m","messages":[{"role":"user","content":"hi"}],"chat_template_kwargs":{"x":1,"reasoning_effort":"low","enable_thinking":true}` + tail},
		{"output_config not an object", `{"messages":[{"role":"user","content":"hi"}],"output_config":"low"}`, ""},
		{"a role vLLM renames in some releases", `{"messages":[{"role":"ctx","content":"hi"}]}`, ""},
		{"an image in the system", `{"system":[{"type":"image","source":{}}],"messages":[{"role":"user","content":"hi"}]}`, ""},
		{"no messages", `{"messages":[]}`, ""},
		{"content neither a string nor blocks", `{"messages":[{"role":"user","content":5}]}`, ""},
		{"a tool without a schema", `{"messages":[{"role":"user","content":"hi"}],"tools":[{"name":"a"}]}`, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tok, ids, _, ok := tokenize.Build(tokenize.PathMessages, []byte(tc.body), "m")
			if ok != (tc.want != "") || string(tok) != tc.want || ids != nil {
				t.Fatalf("Build =\n%s, %v, %v; want\n%s", tok, ids, ok, tc.want)
			}
			if tok != nil && !json.Valid(tok) {
				t.Fatalf("invalid JSON %s", tok)
			}
		})
	}
}

// TestPythonDumps: a tool input prints as Python's json.dumps prints it
// (the expectations are Python 3.11's output), or is refused where Python
// would print something else.
func TestPythonDumps(t *testing.T) {
	for in, want := range map[string]string{
		`{"a":1,"b":[true,null,"x"]}`:                                `{"a": 1, "b": [true, null, "x"]}`,
		`{ "k" : "é 😀 \u0001\u007f\n\t\\\"/<&>" , "z":{} ,"a":[ ] }`: `{"k": "\u00e9 \ud83d\ude00 \u0001\u007f\n\t\\\"/<&>", "z": {}, "a": []}`,
		`{"n":-0,"big":123456789012345678901234567890}`:              `{"n": 0, "big": 123456789012345678901234567890}`,
		`{"b":"\b\f\r"}`:       `{"b": "\b\f\r"}`,
		`{"x":1.5}`:            "",
		`{"x":1e3}`:            "",
		`{"a":1,"a":2}`:        "",
		`{"s":"\ud83d\ude00"}`: "",
		"{\"s\":\"\xff\"}":     "",
	} {
		got, ok := tokenize.PythonDumps([]byte(in))
		if ok != (want != "") || string(got) != want {
			t.Errorf("PythonDumps(%s) = %s, %v; want %s", in, got, ok, want)
		}
	}
}

// TestPythonDumpsMatchesPython compares with Python itself, where it is
// installed, over inputs that exercise escapes, nesting and key order.
func TestPythonDumpsMatchesPython(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 not installed")
	}
	var inputs []string
	for r := rune(0); r < 0x300; r++ {
		s, _ := json.Marshal(string(r))
		inputs = append(inputs, `{"k`+string(s[1:len(s)-1])+`":`+string(s)+`}`)
	}
	inputs = append(inputs, `{"z":1,"a":{"y":[1,[2,{"x":null}]],"b":false},"é":"日本語 😀 \u2028"}`, `{}`, `{"a":[]}`, `{"n":-12,"m":0}`)
	cmd := exec.Command(py, "-c", "import json,sys\nfor l in sys.stdin: print(json.dumps(json.loads(l)))")
	cmd.Stdin = strings.NewReader(strings.Join(inputs, "\n") + "\n")
	out, err := cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	lines := bytes.Split(bytes.TrimSuffix(out, []byte("\n")), []byte("\n"))
	if len(lines) != len(inputs) {
		t.Fatalf("%d lines from python for %d inputs", len(lines), len(inputs))
	}
	for i, in := range inputs {
		got, ok := tokenize.PythonDumps([]byte(in))
		if !ok || !bytes.Equal(got, lines[i]) {
			t.Errorf("PythonDumps(%s) = %s, %v; python prints %s", in, got, ok, lines[i])
		}
	}
}

// TestWithoutBillingHeader: the billing block is cut out of the top-level
// system array and nothing else of the body changes; bodies without one
// come back as they are.
func TestWithoutBillingHeader(t *testing.T) {
	for _, tc := range []struct{ name, body, want string }{
		{"first block", `{"model":"m", "system": [{"type":"text","text":"x-anthropic-billing-header: cch=1f;"}, {"type":"text","text":"rules"}],"messages":[]}`,
			`{"model":"m", "system":[{"type":"text","text":"rules"}],"messages":[]}`},
		{"after the messages, not first", `{"messages":[{"role":"user","content":"x-anthropic-billing-header in a message stays"}],"system":[{"type":"text","text":"a"},{"text":"x-anthropic-billing-header: cch=2;","type":"text","cache_control":{"type":"ephemeral"}}]}`,
			`{"messages":[{"role":"user","content":"x-anthropic-billing-header in a message stays"}],"system":[{"type":"text","text":"a"}]}`},
		{"a system string", `{"system":"x-anthropic-billing-header: cch=3;","messages":[]}`, ""},
		{"no header", `{"system":[{"type":"text","text":"rules"}],"messages":[]}`, ""},
		{"not JSON", `{"system":[x-anthropic-billing-header`, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := tokenize.WithoutBillingHeader([]byte(tc.body))
			if want := tc.want; want == "" {
				if ok || string(got) != tc.body {
					t.Fatalf("changed: %s", got)
				}
				return
			}
			if !ok || string(got) != tc.want {
				t.Fatalf("got %s, %v\nwant %s", got, ok, tc.want)
			}
		})
	}
	one, _ := tokenize.WithoutBillingHeader([]byte(`{"system":[{"type":"text","text":"x-anthropic-billing-header: cch=aa;"},{"type":"text","text":"rules"}]}`))
	two, _ := tokenize.WithoutBillingHeader([]byte(`{"system":[{"type":"text","text":"x-anthropic-billing-header: cch=bb;"},{"type":"text","text":"rules"}]}`))
	if string(one) != string(two) {
		t.Fatalf("two requests differing by the hash differ after: %s, %s", one, two)
	}
}

// FuzzWithoutBillingHeader: any body comes back unchanged or as valid JSON
// (when it was) that is shorter and no longer holds a billing block in its
// system array.
func FuzzWithoutBillingHeader(f *testing.F) {
	f.Add([]byte(`{"system":[{"type":"text","text":"x-anthropic-billing-header: cch=1;"},{"type":"text","text":"r"}],"messages":[]}`))
	f.Add([]byte(`{"system" : [ {"type":"text","text":"x-anthropic-billing-header"} ] , "system":"x"}`))
	f.Add([]byte(`{"system":"x-anthropic-billing-header"}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		got, ok := tokenize.WithoutBillingHeader(body)
		if !ok {
			if !bytes.Equal(got, body) {
				t.Fatalf("not ok, yet changed: %s", got)
			}
			return
		}
		if len(got) >= len(body) || (json.Valid(body) && !json.Valid(got)) {
			t.Fatalf("%s\nbecame %s", body, got)
		}
		if again, ok := tokenize.WithoutBillingHeader(got); ok && json.Valid(body) {
			t.Fatalf("a billing block left: %s", again)
		}
	})
}
