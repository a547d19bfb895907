package vllmsim

import (
	"encoding/binary"
	"math"
)

// outputWords is the vocabulary of generated text. Every word is short and
// lowercase, so it is exactly one token for [Tokenize], and the token ids of
// an output equal Tokenize of its text.
var outputWords = [...]string{
	"the", "a", "model", "cache", "token", "block", "prefix", "router",
	"node", "proxy", "query", "reply", "fast", "slow", "warm", "cold",
	"is", "was", "will", "can", "may", "must", "and", "or",
	"of", "to", "in", "on", "with", "from", "by", "for",
	"data", "text", "word", "line", "page", "note", "plan", "test",
	"good", "new", "old", "big", "small", "long", "short", "next",
	"sends", "keeps", "finds", "holds", "moves", "reads", "writes", "uses",
	"here", "there", "now", "then", "again", "still", "also", "so",
}

// splitmix64 advances a SplitMix64 generator and returns its next value.
func splitmix64(state *uint64) uint64 {
	*state += 0x9e3779b97f4a7c15
	z := *state
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// tokensSeed hashes token ids (FNV-1a 64) into a generator seed.
func tokensSeed(tokens []uint32) uint64 {
	h := uint64(fnvOffset64)
	var buf [4]byte
	for _, t := range tokens {
		binary.LittleEndian.PutUint32(buf[:], t)
		for _, c := range buf {
			h = (h ^ uint64(c)) * fnvPrime64
		}
	}
	return h
}

// spacedWords are the outputWords with a leading space: every piece of an
// output but the first is one of them.
var spacedWords = func() (s [len(outputWords)]string) {
	for i, w := range outputWords {
		s[i] = " " + w
	}
	return s
}()

// generate returns the n output pieces for a prompt: piece i is a word from
// outputWords, preceded by a space when i > 0, so the pieces concatenate to
// the output text. The choice depends only on the prompt tokens.
func generate(prompt []uint32, n int) []string {
	return generateChoice(prompt, 0, n)
}

// generateChoice returns the n output pieces of choice i of a request (its
// n parameter): choice 0 is generate's output, every other choice draws its
// words from a seed of its own, as a sampled sequence would differ.
func generateChoice(prompt []uint32, choice, n int) []string {
	state := tokensSeed(prompt)
	if choice > 0 {
		c := uint64(choice)
		state ^= splitmix64(&c)
	}
	out := make([]string, n)
	for i := range out {
		k := splitmix64(&state) % uint64(len(outputWords))
		if i > 0 {
			out[i] = spacedWords[k]
		} else {
			out[i] = outputWords[k]
		}
	}
	return out
}

// embeddingDims is the length of the vectors /v1/embeddings returns.
const embeddingDims = 64

// embed returns a deterministic, L2-normalised embedding of a token
// sequence: a signed feature hash of its unigrams (weight 1) and bigrams
// (weight 0.5). Equal sequences give equal vectors; sequences that share
// many tokens give close vectors. An empty sequence gets a fixed unit vector.
func embed(tokens []uint32) []float32 {
	var v [embeddingDims]float64
	add := func(seed uint64, w float64) {
		s := seed
		h := splitmix64(&s)
		idx := h % embeddingDims
		if h&(1<<63) != 0 {
			w = -w
		}
		v[idx] += w
	}
	for i, t := range tokens {
		add(uint64(t), 1)
		if i > 0 {
			add(uint64(tokens[i-1])<<32|uint64(t)|1<<31, 0.5)
		}
	}
	var norm float64
	for _, x := range v {
		norm += x * x
	}
	out := make([]float32, embeddingDims)
	if norm == 0 {
		out[0] = 1
		return out
	}
	norm = math.Sqrt(norm)
	for i, x := range v {
		out[i] = float32(x / norm)
	}
	return out
}
