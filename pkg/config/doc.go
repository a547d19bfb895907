// Package config is rolter's configuration model, shared by every service.
//
// # Overview
//
// Configuration moves through fixed phases:
//
//  1. [Parse] decodes TOML strictly: a syntax error names its line and
//     column, an unknown key or a value of the wrong type names its field
//     path (`routes[2].cache.ttl`).
//  2. Defaults are applied in one place ([Default] for the sections,
//     applyDefaults for list elements).
//  3. [Config.Validate] reports every failure at once, each with its field
//     path and value (`routes[2].targets[0].provider: unknown provider "vllm-z"`).
//  4. [Compile] resolves secrets (API keys from env or file, virtual keys to
//     peppered digests) and builds an immutable [Snapshot] with lookup
//     indexes. A Snapshot is never mutated after Compile returns.
//
// # Concurrency
//
// A [Config] is a plain value owned by its caller. A [Snapshot] is immutable
// and safe for concurrent use; services hold it in an atomic.Pointer and swap
// it whole on reload.
package config
