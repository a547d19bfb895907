package affinity

import "bytes"

// The readers below follow the prompt rules object by object. Each object is
// walked once in document order. A field is read on the spot when every
// field that the rules read before it has been read (the speculative plan);
// otherwise it is delimited with lax and its span kept. When the object
// closes, the actions the rules call for are worked out from the last
// occurrence of each field (as a map decoder sees them) and compared with
// what was done on the spot: the rest is read from the kept spans, and a
// mismatch (duplicate keys, a turn with both content and output…) aborts the
// whole read, which Parse repeats in careful mode, where nothing is read on
// the spot.

// span is a member value seen in the current object.
type span struct {
	at, end int
	d       int  // depth of the value's container
	ok      bool // seen
	lax     bool // delimited but not validated yet
}

// Action kinds.
const (
	aNone     uint8 = iota
	aHeadTurn       // top level: push_turn("system", system or instructions)
	aBody           // top level: messages, input or prompt, by endpoint
	aTurn           // item: push_turn(role, content)
	aAbsorbM        // absorb(span, measured)
	aWholeU         // absorb(the object itself, not measured)
	aWholeM         // absorb(the object itself, measured)
	aTools          // item: tool_calls
	aPushStr        // part: push(text)
	aToolRes        // part: the content of a tool_result
)

type act struct {
	kind    uint8
	id      keyID // the span the action reads (kOther for the object itself)
	at, end int
	role    int // aTurn: offset of the role value, or -1
}

// frame is the state of one object being read.
type frame struct {
	start, end int // the object's own extent
	d          int // depth of the object (its members' container depth)
	sp         [kCount]span
	done       [2]act
	nd         int
}

func (f *frame) did(a act) {
	if f.nd < len(f.done) {
		f.done[f.nd] = a
	}
	f.nd++
}

func (f *frame) seen(id keyID) bool { return f.sp[id].ok }

// record keeps the span of a member value. A span it replaces that was only
// delimited is validated first, so no byte escapes validation.
func (b *builder) record(f *frame, id keyID, at, end, d int, lax bool) int {
	sp := &f.sp[id]
	if sp.ok && sp.lax && b.value(sp.at, mSkip, sp.d) != sp.end {
		return b.invalid()
	}
	*sp = span{at: at, end: end, d: d, ok: true, lax: lax}
	return end
}

// settle compares what was done on the spot with the actions the rules call
// for, does the rest, and validates the spans nobody read.
func (b *builder) settle(f *frame, want []act) bool {
	if f.nd > len(want) {
		b.conflict()
		return false
	}
	for k, a := range want {
		if k < f.nd {
			if f.done[k] != a {
				b.conflict()
				return false
			}
			continue
		}
		if !b.exec(f, a) {
			return false
		}
	}
	for id := range f.sp {
		sp := &f.sp[id]
		if sp.ok && sp.lax && b.value(sp.at, mSkip, sp.d) != sp.end {
			b.invalid()
			return false
		}
	}
	return true
}

// exec performs one deferred action.
func (b *builder) exec(f *frame, a act) bool {
	var end int
	switch a.kind {
	case aHeadTurn:
		end = b.turn(litSystem, -1, a.at, f.d)
	case aBody:
		end = b.promptField(a.at, f.d)
	case aTurn:
		end = b.turn(litItem, a.role, a.at, f.d)
	case aAbsorbM:
		end = b.absorb(a.at, true, f.sp[a.id].d)
	case aWholeU, aWholeM:
		end = b.absorb(f.start, a.kind == aWholeM, f.d-1)
		for id := range f.sp {
			f.sp[id].lax = false // all validated by the walk
		}
	case aTools:
		end = b.toolCalls(a.at, f.d)
	case aPushStr:
		end = b.str(a.at, mPush)
	case aToolRes:
		end = b.toolResult(a.at, f.d)
	}
	if end < 0 {
		return false
	}
	if end != a.end {
		b.invalid()
		return false
	}
	f.sp[a.id].lax = false
	return true
}

// absorb hashes the value at s[i]: a string's decoded bytes, anything else
// as compact JSON. measured adds the bytes to the prompt length.
func (b *builder) absorb(i int, measured bool, d int) int {
	prev := b.measured
	b.measured = measured
	var end int
	if b.body[i] == '"' {
		end = b.str(i, mAbsorb)
	} else {
		end = b.value(i, mCompact, d)
	}
	b.measured = prev
	return end
}

// turn is push_turn: the role (the string at roleAt, else def), ": ", the
// content at v, "\n".
func (b *builder) turn(def []byte, roleAt, v, d int) int {
	if roleAt >= 0 && b.body[roleAt] == '"' {
		if b.str(roleAt, mPush) < 0 {
			return errPos
		}
	} else {
		b.push(def)
	}
	b.push(litColon)
	end := b.pushText(v, d)
	b.push(litNewline)
	return end
}

// document reads the top-level object. It returns false when the body gives
// no prompt (see b.failed for why, when it is not simply absent).
func (b *builder) document() bool {
	s := b.body
	i := ws(s, 0)
	if i >= len(s) || s[i] != '{' {
		return false // not an object: no prompt either way
	}
	head, body := kOther, kOther
	switch b.ep {
	case epChat:
		body = kMessages
	case epMessages:
		head, body = kSystem, kMessages
	case epResponses:
		head, body = kInstructions, kInput
	case epCompletions:
		body = kPrompt
	case epEmbeddings:
		body = kInput
	}
	f := frame{start: i, d: 1}
	it := objIter{i: i + 1}
	for {
		id, v := b.next(&it)
		if v == closedPos {
			break
		}
		if v < 0 {
			return false
		}
		var end int
		switch {
		case id == head && head != kOther:
			if b.fast() && f.nd == 0 {
				end = b.turn(litSystem, -1, v, 1)
				f.did(act{kind: aHeadTurn, id: id, at: v, end: end, role: -1})
				end = b.recordRead(&f, id, v, end)
			} else {
				end = b.recordLax(&f, id, v)
			}
		case id == body:
			headDone := head == kOther && f.nd == 0 ||
				head != kOther && f.nd == 1 && f.done[0].kind == aHeadTurn
			if b.fast() && headDone {
				end = b.promptField(v, 1)
				f.did(act{kind: aBody, id: id, at: v, end: end, role: -1})
				end = b.recordRead(&f, id, v, end)
			} else {
				end = b.recordLax(&f, id, v)
			}
		default:
			end = b.value(v, mSkip, 1)
		}
		if end < 0 {
			return false
		}
		it.i = end
	}
	if ws(s, it.i) != len(s) {
		b.invalid()
		return false
	}
	if !f.seen(body) {
		// No prompt field. Whatever else the body holds, the raw body is the
		// prompt; it is not worth validating the fields left unread.
		return false
	}
	var want [2]act
	n := 0
	if head != kOther && f.seen(head) {
		sp := f.sp[head]
		want[n] = act{kind: aHeadTurn, id: head, at: sp.at, end: sp.end, role: -1}
		n++
	}
	sp := f.sp[body]
	want[n] = act{kind: aBody, id: body, at: sp.at, end: sp.end, role: -1}
	n++
	return b.settle(&f, want[:n])
}

// recordLax delimits the value at v and keeps its span for later.
func (b *builder) recordLax(f *frame, id keyID, v int) int {
	end := b.lax(v)
	if end < 0 {
		return errPos
	}
	return b.record(f, id, v, end, f.d, true)
}

// recordRead keeps the span of a value that was read (and so validated).
func (b *builder) recordRead(f *frame, id keyID, v, end int) int {
	if end < 0 {
		return errPos
	}
	return b.record(f, id, v, end, f.d, false)
}

// recordSkip validates the value at v and keeps its span.
func (b *builder) recordSkip(f *frame, id keyID, v int) int {
	return b.recordRead(f, id, v, b.value(v, mSkip, f.d))
}

// promptField reads the top-level prompt field at v by endpoint.
func (b *builder) promptField(v, d int) int {
	switch b.ep {
	case epChat, epMessages:
		return b.turns(v, d)
	case epResponses:
		if b.body[v] == '"' {
			return b.turn(litUser, -1, v, d)
		}
		return b.turns(v, d)
	default:
		return b.pushText(v, d)
	}
}

// turns reads a list of messages or Responses input items; anything but an
// array gives nothing.
func (b *builder) turns(v, d int) int {
	if b.body[v] != '[' {
		return b.value(v, mSkip, d)
	}
	it := arrIter{i: v + 1}
	for {
		e := b.elem(&it)
		if e == closedPos {
			return it.i
		}
		if e < 0 {
			return errPos
		}
		var end int
		if b.body[e] == '{' {
			end = b.item(e, d+1)
		} else {
			end = b.absorb(e, false, d+1) // role "item", no content: the item itself
		}
		if end < 0 {
			return errPos
		}
		it.i = end
	}
}

// item reads one message or input item (an object at s[i] in a container at
// depth d).
func (b *builder) item(i, d int) int {
	s := b.body
	f := frame{start: i, d: d + 1}
	it := objIter{i: i + 1}
	mcp := false // a Responses mcp_call carries both arguments and output
	for {
		id, v := b.next(&it)
		if v == closedPos {
			break
		}
		if v < 0 {
			return errPos
		}
		var end int
		switch id {
		case kRole:
			end = b.recordSkip(&f, id, v)
		case kContent:
			if b.fast() && f.nd == 0 && f.seen(kRole) && !f.seen(kContent) {
				role := f.sp[kRole].at
				end = b.turn(litItem, role, v, f.d)
				f.did(act{kind: aTurn, id: id, at: v, end: end, role: role})
				end = b.recordRead(&f, id, v, end)
			} else {
				end = b.recordLax(&f, id, v)
			}
		case kOutput:
			switch {
			case f.seen(kContent):
				end = b.recordSkip(&f, id, v)
			case b.fast() && f.nd == 0:
				end = b.absorb(v, true, f.d)
				f.did(act{kind: aAbsorbM, id: id, at: v, end: end, role: -1})
				end = b.recordRead(&f, id, v, end)
			default:
				end = b.recordLax(&f, id, v)
			}
		case kArguments:
			switch {
			case f.seen(kContent) || f.seen(kOutput):
				end = b.recordSkip(&f, id, v)
			case b.fast() && f.nd == 0 && !mcp:
				end = b.absorb(v, true, f.d)
				f.did(act{kind: aAbsorbM, id: id, at: v, end: end, role: -1})
				end = b.recordRead(&f, id, v, end)
			default:
				end = b.recordLax(&f, id, v)
			}
		case kToolCalls:
			if b.fast() && f.nd == 1 && f.done[0].kind != aTools && s[v] == '[' {
				end = b.toolCalls(v, f.d)
				f.did(act{kind: aTools, id: id, at: v, end: end, role: -1})
				end = b.recordRead(&f, id, v, end)
			} else {
				end = b.recordLax(&f, id, v)
			}
		case kType:
			end = b.recordSkip(&f, id, v)
			if end < 0 {
				return errPos
			}
			t, _, _ := b.small(v, end)
			mcp = string(t) == "mcp_call"
			if b.fast() && f.nd == 0 && !f.seen(kContent) && !f.seen(kOutput) &&
				!f.seen(kArguments) && wholeItem(t) {
				return b.whole(&f, false, lvItem)
			}
		default:
			end = b.value(v, mSkip, f.d)
		}
		if end < 0 {
			return errPos
		}
		it.i = end
	}
	f.end = it.i
	return b.finish(&f, lvItem)
}

// itemWant lists the actions the rules call for on an item.
func (b *builder) itemWant(f *frame, want *[2]act) int {
	sp := &f.sp
	switch {
	case sp[kContent].ok:
		role := -1
		if sp[kRole].ok {
			role = sp[kRole].at
		}
		want[0] = act{kind: aTurn, id: kContent, at: sp[kContent].at, end: sp[kContent].end, role: role}
	case sp[kOutput].ok:
		want[0] = act{kind: aAbsorbM, id: kOutput, at: sp[kOutput].at, end: sp[kOutput].end, role: -1}
	case sp[kArguments].ok:
		want[0] = act{kind: aAbsorbM, id: kArguments, at: sp[kArguments].at, end: sp[kArguments].end, role: -1}
	default:
		want[0] = act{kind: aWholeU, at: f.start, end: f.end, role: -1}
	}
	if tc := sp[kToolCalls]; tc.ok && b.body[tc.at] == '[' {
		want[1] = act{kind: aTools, id: kToolCalls, at: tc.at, end: tc.end, role: -1}
		return 2
	}
	return 1
}

// wholeItem reports Responses item types that carry neither content, output
// nor arguments, so the item itself is absorbed (a guess: a wrong one only
// costs a second read).
func wholeItem(t []byte) bool {
	switch string(t) {
	case "reasoning", "item_reference", "compaction", "mcp_list_tools", "mcp_approval_response",
		"web_search_call", "file_search_call", "computer_call", "image_generation_call",
		"code_interpreter_call", "local_shell_call", "custom_tool_call":
		return true
	}
	return false
}

// Object levels whose actions finish works out.
const (
	lvItem uint8 = iota
	lvPart
	lvBlock
	lvCall
)

// finish settles a frame whose walk is over.
func (b *builder) finish(f *frame, lv uint8) int {
	var w [2]act
	var n int
	switch lv {
	case lvItem:
		n = b.itemWant(f, &w)
	case lvPart:
		n = b.partWant(f, &w)
	case lvBlock:
		n = b.blockWant(f, &w)
	default:
		n = b.callWant(f, &w)
	}
	if !b.settle(f, w[:n]) {
		return errPos
	}
	return f.end
}

// whole absorbs the object of f as compact JSON from its start, noting the
// spans of the keys the rules look at, then settles the frame: the rules
// must call for exactly that absorption first.
func (b *builder) whole(f *frame, measured bool, lv uint8) int {
	s := b.body
	f.sp = [kCount]span{}
	prev := b.measured
	b.measured = measured
	b.cbyte('{')
	i := ws(s, f.start+1)
	if i < len(s) && s[i] == '}' {
		b.cbyte('}')
		i++
	} else {
		for {
			if i >= len(s) || s[i] != '"' {
				b.measured = prev
				return b.invalid()
			}
			ks := i
			i = b.key(i, mCompact)
			if i < 0 {
				b.measured = prev
				return errPos
			}
			v := i
			i = b.value(v, mCompact, f.d)
			if i < 0 {
				b.measured = prev
				return errPos
			}
			if id := b.keyAt(ks, b.laxStr(ks)); id != kOther {
				f.sp[id] = span{at: v, end: i, d: f.d, ok: true}
			}
			i = ws(s, i)
			if i >= len(s) {
				b.measured = prev
				return b.invalid()
			}
			if s[i] == ',' {
				b.cbyte(',')
				i = ws(s, i+1)
				continue
			}
			if s[i] != '}' {
				b.measured = prev
				return b.invalid()
			}
			b.cbyte('}')
			i++
			break
		}
	}
	b.measured = prev
	f.end = i
	kind := aWholeU
	if measured {
		kind = aWholeM
	}
	f.nd = 0
	f.did(act{kind: kind, at: f.start, end: f.end, role: -1})
	return b.finish(f, lv)
}

// pushText is push_text: a string is pushed, an array's string parts and
// text parts are pushed and its other objects go to push_part; anything
// else gives nothing.
func (b *builder) pushText(v, d int) int {
	s := b.body
	switch s[v] {
	case '"':
		return b.str(v, mPush)
	case '[':
	default:
		return b.value(v, mSkip, d)
	}
	it := arrIter{i: v + 1}
	for {
		e := b.elem(&it)
		if e == closedPos {
			return it.i
		}
		if e < 0 {
			return errPos
		}
		var end int
		switch s[e] {
		case '"':
			end = b.str(e, mPush)
		case '{':
			end = b.part(e, d+1)
		default:
			end = b.value(e, mSkip, d+1)
		}
		if end < 0 {
			return errPos
		}
		it.i = end
	}
}

// Part type categories.
const (
	catNone       = iota // no type, or not a string
	catToolResult        // "tool_result"
	catToolUse           // "tool_use"
	catText              // a type naming text ("text", "input_text"…): expect a text field
	catMedia             // anything else: image_url, image, input_audio, file, document…
)

func (b *builder) typeCat(sp span) int {
	if !sp.ok {
		return catNone
	}
	t, isStr, fits := b.small(sp.at, sp.end)
	switch {
	case !isStr:
		return catNone
	case fits && string(t) == "tool_result":
		return catToolResult
	case fits && string(t) == "tool_use":
		return catToolUse
	case bytes.Contains(t, []byte("text")):
		return catText
	}
	return catMedia
}

// textStr reports whether the part has a string text field.
func (b *builder) textStr(f *frame) bool {
	return f.sp[kText].ok && b.body[f.sp[kText].at] == '"'
}

// part is one object of a content array.
func (b *builder) part(i, d int) int {
	s := b.body
	f := frame{start: i, d: d + 1}
	it := objIter{i: i + 1}
	for {
		id, v := b.next(&it)
		if v == closedPos {
			break
		}
		if v < 0 {
			return errPos
		}
		var end int
		switch id {
		case kText:
			switch {
			case s[v] != '"':
				end = b.recordSkip(&f, id, v)
			case b.fast() && f.nd == 0:
				end = b.str(v, mPush)
				f.did(act{kind: aPushStr, id: id, at: v, end: end, role: -1})
				end = b.recordRead(&f, id, v, end)
			default:
				end = b.recordLax(&f, id, v)
			}
		case kType:
			end = b.recordSkip(&f, id, v)
			if end >= 0 && b.fast() && f.nd == 0 && !b.textStr(&f) &&
				b.typeCat(f.sp[kType]) == catMedia {
				return b.whole(&f, false, lvPart)
			}
		case kContent:
			cat := b.typeCat(f.sp[kType])
			switch {
			case b.fast() && f.nd == 0 && cat == catToolResult && !b.textStr(&f):
				end = b.toolResult(v, f.d)
				f.did(act{kind: aToolRes, id: id, at: v, end: end, role: -1})
				end = b.recordRead(&f, id, v, end)
			case f.seen(kType) && cat != catToolResult:
				end = b.recordSkip(&f, id, v)
			default:
				end = b.recordLax(&f, id, v)
			}
		case kInput:
			cat := b.typeCat(f.sp[kType])
			switch {
			case b.fast() && f.nd == 0 && cat == catToolUse && !b.textStr(&f):
				end = b.absorb(v, true, f.d)
				f.did(act{kind: aAbsorbM, id: id, at: v, end: end, role: -1})
				end = b.recordRead(&f, id, v, end)
			case f.seen(kType) && cat != catToolUse:
				end = b.recordSkip(&f, id, v)
			default:
				end = b.recordLax(&f, id, v)
			}
		default:
			end = b.value(v, mSkip, f.d)
		}
		if end < 0 {
			return errPos
		}
		it.i = end
	}
	f.end = it.i
	return b.finish(&f, lvPart)
}

// partWant is the action push_text and push_part call for on a part.
func (b *builder) partWant(f *frame, want *[2]act) int {
	sp := &f.sp
	whole := act{kind: aWholeU, at: f.start, end: f.end, role: -1}
	switch {
	case b.textStr(f):
		want[0] = act{kind: aPushStr, id: kText, at: sp[kText].at, end: sp[kText].end, role: -1}
	default:
		switch b.typeCat(sp[kType]) {
		case catToolResult:
			if sp[kContent].ok {
				want[0] = act{kind: aToolRes, id: kContent, at: sp[kContent].at, end: sp[kContent].end, role: -1}
			} else {
				want[0] = whole
			}
		case catToolUse:
			if sp[kInput].ok {
				want[0] = act{kind: aAbsorbM, id: kInput, at: sp[kInput].at, end: sp[kInput].end, role: -1}
			} else {
				whole.kind = aWholeM
				want[0] = whole
			}
		default:
			want[0] = whole
		}
	}
	return 1
}

// toolResult reads the content of a tool_result part: an array's blocks give
// their text (measured) or themselves (not measured); any other content is
// absorbed measured.
func (b *builder) toolResult(v, d int) int {
	s := b.body
	if s[v] != '[' {
		return b.absorb(v, true, d)
	}
	it := arrIter{i: v + 1}
	for {
		e := b.elem(&it)
		if e == closedPos {
			return it.i
		}
		if e < 0 {
			return errPos
		}
		var end int
		if s[e] == '{' {
			end = b.block(e, d+1)
		} else {
			end = b.absorb(e, false, d+1)
		}
		if end < 0 {
			return errPos
		}
		it.i = end
	}
}

// block is one object of a tool_result's content array.
func (b *builder) block(i, d int) int {
	f := frame{start: i, d: d + 1}
	it := objIter{i: i + 1}
	for {
		id, v := b.next(&it)
		if v == closedPos {
			break
		}
		if v < 0 {
			return errPos
		}
		var end int
		switch id {
		case kText:
			if b.fast() && f.nd == 0 {
				end = b.absorb(v, true, f.d)
				f.did(act{kind: aAbsorbM, id: id, at: v, end: end, role: -1})
				end = b.recordRead(&f, id, v, end)
			} else {
				end = b.recordLax(&f, id, v)
			}
		case kType:
			end = b.recordSkip(&f, id, v)
			if end >= 0 && b.fast() && f.nd == 0 && !f.seen(kText) {
				if c := b.typeCat(f.sp[kType]); c != catText && c != catNone {
					return b.whole(&f, false, lvBlock)
				}
			}
		default:
			end = b.value(v, mSkip, f.d)
		}
		if end < 0 {
			return errPos
		}
		it.i = end
	}
	f.end = it.i
	return b.finish(&f, lvBlock)
}

func (b *builder) blockWant(f *frame, want *[2]act) int {
	if t := f.sp[kText]; t.ok {
		want[0] = act{kind: aAbsorbM, id: kText, at: t.at, end: t.end, role: -1}
	} else {
		want[0] = act{kind: aWholeU, at: f.start, end: f.end, role: -1}
	}
	return 1
}

// toolCalls reads an OpenAI tool_calls array: each call's
// /function/arguments, or the call itself, absorbed measured.
func (b *builder) toolCalls(v, d int) int {
	s := b.body
	if s[v] != '[' {
		return b.value(v, mSkip, d)
	}
	it := arrIter{i: v + 1}
	for {
		e := b.elem(&it)
		if e == closedPos {
			return it.i
		}
		if e < 0 {
			return errPos
		}
		var end int
		if s[e] == '{' {
			end = b.call(e, d+1)
		} else {
			end = b.absorb(e, true, d+1)
		}
		if end < 0 {
			return errPos
		}
		it.i = end
	}
}

// call is one object of a tool_calls array. The arguments of its (last)
// function object are kept in the kAux span.
func (b *builder) call(i, d int) int {
	s := b.body
	f := frame{start: i, d: d + 1}
	it := objIter{i: i + 1}
	for {
		id, v := b.next(&it)
		if v == closedPos {
			break
		}
		if v < 0 {
			return errPos
		}
		var end int
		if id == kFunction {
			// A later function object replaces the arguments of an earlier one.
			if a := &f.sp[kAux]; a.ok {
				if a.lax && b.value(a.at, mSkip, a.d) != a.end {
					return b.invalid()
				}
				*a = span{}
			}
			if s[v] == '{' {
				end = b.function(v, &f)
			} else {
				end = b.value(v, mSkip, f.d)
			}
			end = b.recordRead(&f, id, v, end)
		} else {
			end = b.value(v, mSkip, f.d)
		}
		if end < 0 {
			return errPos
		}
		it.i = end
	}
	f.end = it.i
	return b.finish(&f, lvCall)
}

// function walks a call's function object at v, reading or delimiting its
// arguments into the call frame's kAux span.
func (b *builder) function(v int, cf *frame) int {
	d := cf.d + 1
	it := objIter{i: v + 1}
	for {
		id, w := b.next(&it)
		if w == closedPos {
			return it.i
		}
		if w < 0 {
			return errPos
		}
		var end int
		if id == kArguments {
			if b.fast() && cf.nd == 0 {
				end = b.absorb(w, true, d)
				cf.did(act{kind: aAbsorbM, id: kAux, at: w, end: end, role: -1})
				if end >= 0 {
					end = b.record(cf, kAux, w, end, d, false)
				}
			} else if end = b.lax(w); end >= 0 {
				end = b.record(cf, kAux, w, end, d, true)
			}
		} else {
			end = b.value(w, mSkip, d)
		}
		if end < 0 {
			return errPos
		}
		it.i = end
	}
}

func (b *builder) callWant(f *frame, want *[2]act) int {
	if fn, a := f.sp[kFunction], f.sp[kAux]; fn.ok && b.body[fn.at] == '{' && a.ok {
		want[0] = act{kind: aAbsorbM, id: kAux, at: a.at, end: a.end, role: -1}
	} else {
		want[0] = act{kind: aWholeM, at: f.start, end: f.end, role: -1}
	}
	return 1
}
