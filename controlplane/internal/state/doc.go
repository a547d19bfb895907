// Package state is the control plane's model of the stored configuration:
// the global sections, providers, routes and virtual keys, each one object
// with its etcd revisions, and their conversions to and from
// [config.Config], TOML and diffs.
//
// # Overview
//
// A [State] is what the control plane keeps in etcd: one object per
// provider, route and key, plus the settings object for the global sections.
// Virtual keys hold only a key_digest (or a key_env reference): [FromConfig]
// replaces an inline secret by its peppered digest before anything is
// stored. [State.Check] is the consistency check run before a state is
// stored or published: [config.Config.Validate] plus a trial
// [config.Compile] with placeholder secrets, the same code the data planes
// run. [State.Render] writes the TOML pushed to data planes and kvwatchers.
//
// # Concurrency
//
// A State is a plain value. Published states are never mutated; writers
// work on a [State.Clone].
package state
