package delivery

import (
	"fmt"
	"net/url"
	"regexp"
	"unicode/utf8"
)

// Defaults of the delivery configuration (rolter-behaviour.md §3.11).
const (
	DefaultMaxScanBytes      = 262144
	DefaultPluginTimeoutMS   = 2000
	DefaultPIITimeoutMS      = 5000
	MaxReplacementChars      = 64
	DefaultPatternRedaction  = "[REDACTED]"
	maxTimeoutMS             = 60000
	maxGuardrailRules        = 256
	maxPlugins               = 64
	defaultStreamingPostCall = StreamingReject
)

// Enumerated config values.
const (
	// Guardrail rule stages.
	StagePreCall  = "pre_call"
	StagePostCall = "post_call"
	// Guardrail rule actions.
	ActionAnnotate = "annotate"
	ActionBlock    = "block"
	ActionRedact   = "redact"
	// Built-in detectors.
	BuiltinEmail       = "email"
	BuiltinPhone       = "phone"
	BuiltinAPIToken    = "api_token"
	BuiltinPaymentCard = "payment_card"
	// Streaming treatment of guardrails (streaming_post_call) and of the PII
	// response leg (streaming).
	StreamingReject      = "reject"
	StreamingPassthrough = "passthrough"
	// Plugin stages. Only post_response plugins run in a [Policy]; the
	// others are parsed and validated for the request path.
	PluginStagePreRoute     = "pre_route"
	PluginStagePreUpstream  = "pre_upstream"
	PluginStagePostResponse = "post_response"
	// Failure modes of plugins and the PII sanitizer.
	FailOpen   = "fail_open"
	FailClosed = "fail_closed"
	// PII sanitizer directions.
	DirectionRequest  = "request"
	DirectionResponse = "response"
	DirectionBoth     = "both"
	// PII restoration modes.
	RestorationNever             = "never"
	RestorationTrustedDownstream = "trusted_downstream"
	RestorationCallerAuthorized  = "caller_authorized"
)

// Config is everything a [Policy] is built from: the [guardrails] table,
// the [[plugins]] list and the [pii_sanitizer] table. The caller embeds the
// three parts in its own config model under those TOML keys and passes them
// here together.
type Config struct {
	Guardrails GuardrailsConfig
	Plugins    []PluginConfig
	PII        PIIConfig
}

// GuardrailsConfig is the [guardrails] table: built-in regex guardrails on
// requests (pre_call rules) and on buffered responses (post_call rules).
type GuardrailsConfig struct {
	// Enabled switches every rule on or off (default true; with no rules
	// nothing happens).
	Enabled bool `toml:"enabled"`
	// MaxScanBytes caps the text scanned per request or response (default
	// 262144). Text past the cap is neither matched nor redacted.
	MaxScanBytes int `toml:"max_scan_bytes"`
	// StreamingPostCall decides what happens to a streamed response when
	// post_call rules exist: "reject" (default) refuses the stream up front
	// with 400 guardrail_streaming_unsupported, "passthrough" serves it
	// unscanned.
	StreamingPostCall string `toml:"streaming_post_call"`
	// Rules are applied in order.
	Rules []GuardrailRule `toml:"rules"`
}

// GuardrailRule is one [[guardrails.rules]] element. Exactly one of Builtin
// and Pattern is set.
type GuardrailRule struct {
	// Name identifies the rule in refusals, headers, logs and metrics.
	Name string `toml:"name"`
	// Builtin is one of email, phone, api_token, payment_card.
	Builtin string `toml:"builtin"`
	// Pattern is a Go (RE2) regular expression.
	Pattern string `toml:"pattern"`
	// Stage is pre_call (the request) or post_call (the response); required.
	Stage string `toml:"stage"`
	// Action is annotate (default), block or redact.
	Action string `toml:"action"`
	// Replacement replaces each match of a redact rule (at most 64
	// characters; default [REDACTED:EMAIL], [REDACTED:PHONE],
	// [REDACTED:API_TOKEN], [REDACTED:CARD], or [REDACTED] for a pattern).
	Replacement string `toml:"replacement"`
	// IncludeSystem makes a pre_call rule scan system and developer
	// instructions too (default false).
	IncludeSystem bool `toml:"include_system"`
	// ToolCalls makes a post_call block or annotate rule scan the tool
	// calls the model makes too (their arguments, an Anthropic tool_use's
	// input): what an agent sends on to its tools, such as a URL a fetch
	// tool will open (default false).
	ToolCalls bool `toml:"tool_calls"`
}

// PluginConfig is one [[plugins]] element: an HTTP webhook consulted at a
// stage of the request.
type PluginConfig struct {
	// Name identifies the plugin in refusals, logs and metrics; unique.
	Name string `toml:"name"`
	// URL receives a POST of the JSON envelope.
	URL string `toml:"url"`
	// Stage is post_response, pre_route or pre_upstream; required.
	Stage string `toml:"stage"`
	// TimeoutMS bounds one call (default 2000).
	TimeoutMS int `toml:"timeout_ms"`
	// FailureMode is fail_open (default: a failed call is skipped) or
	// fail_closed (a failed call refuses the response).
	FailureMode string `toml:"failure_mode"`
	// AuthTokenEnv names an environment variable holding a bearer token
	// sent as "Authorization: Bearer <token>". It is read when the policy
	// is built; an unset variable fails the build.
	AuthTokenEnv string `toml:"auth_token_env"`
}

// PIIConfig is the [pii_sanitizer] table: an external HTTP service that
// replaces personal data in requests (request leg) and responses (response
// leg), and can restore the request's placeholders in the response.
type PIIConfig struct {
	// Enabled switches the sanitizer on (default false).
	Enabled bool `toml:"enabled"`
	// URL is the sanitize endpoint; required when enabled.
	URL string `toml:"url"`
	// RestoreURL is the restore endpoint; required unless restoration is
	// never.
	RestoreURL string `toml:"restore_url"`
	// Direction is request (default), response or both.
	Direction string `toml:"direction"`
	// Restoration is never (default), trusted_downstream (always restore
	// the request's placeholders in the response) or caller_authorized
	// (only when the caller sends x-rolter-pii-restore: 1|true|yes).
	Restoration string `toml:"restoration"`
	// Streaming decides what happens to a streamed response the response
	// leg would apply to: reject (default, 400 pii_streaming_unsupported)
	// or passthrough (served without the response leg).
	Streaming string `toml:"streaming"`
	// TimeoutMS bounds one call (default 5000).
	TimeoutMS int `toml:"timeout_ms"`
	// FailureMode is fail_open (default) or fail_closed.
	FailureMode string `toml:"failure_mode"`
	// Entities, when not empty, is passed to the service to restrict what
	// it looks for.
	Entities []string `toml:"entities"`
	// AuthTokenEnv names an environment variable holding a bearer token
	// for both endpoints.
	AuthTokenEnv string `toml:"auth_token_env"`
}

// DefaultGuardrails returns the [guardrails] defaults.
func DefaultGuardrails() GuardrailsConfig {
	return GuardrailsConfig{
		Enabled:           true,
		MaxScanBytes:      DefaultMaxScanBytes,
		StreamingPostCall: defaultStreamingPostCall,
	}
}

// DefaultPII returns the [pii_sanitizer] defaults.
func DefaultPII() PIIConfig {
	return PIIConfig{
		Direction:   DirectionRequest,
		Restoration: RestorationNever,
		Streaming:   StreamingReject,
		TimeoutMS:   DefaultPIITimeoutMS,
		FailureMode: FailOpen,
	}
}

// ApplyDefaults fills the defaults of the rules (action annotate), which a
// section default cannot pre-fill. It is idempotent.
func (g *GuardrailsConfig) ApplyDefaults() {
	for i := range g.Rules {
		if g.Rules[i].Action == "" {
			g.Rules[i].Action = ActionAnnotate
		}
	}
}

// ApplyPluginDefaults fills the defaults of every plugin (timeout_ms 2000,
// failure_mode fail_open). It is idempotent.
func ApplyPluginDefaults(plugins []PluginConfig) {
	for i := range plugins {
		p := &plugins[i]
		if p.TimeoutMS == 0 {
			p.TimeoutMS = DefaultPluginTimeoutMS
		}
		if p.FailureMode == "" {
			p.FailureMode = FailOpen
		}
	}
}

// FieldError is one configuration problem at one field path, for example
// `guardrails.rules[2].pattern: invalid regexp: missing closing )`.
type FieldError struct {
	Path string
	Msg  string
}

func (e *FieldError) Error() string { return e.Path + ": " + e.Msg }

type validator struct{ errs []error }

func (v *validator) add(path, format string, args ...any) {
	v.errs = append(v.errs, &FieldError{Path: path, Msg: fmt.Sprintf(format, args...)})
}

func (v *validator) oneOf(path, got string, allowed ...string) {
	for _, a := range allowed {
		if got == a {
			return
		}
	}
	v.add(path, "must be one of %q, got %q", allowed, got)
}

func (v *validator) timeout(path string, ms int) {
	if ms < 1 || ms > maxTimeoutMS {
		v.add(path, "must be in [1, %d], got %d", maxTimeoutMS, ms)
	}
}

func (v *validator) httpURL(path, s string) {
	u, err := url.Parse(s)
	if s == "" || err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		v.add(path, "must be an absolute http:// or https:// URL, got %q", redactURL(s))
	}
}

var (
	namePattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:-]*$`)
	envPattern  = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
)

// Validate checks the [guardrails] table; path is its key ("guardrails").
// Every problem is reported, each a [*FieldError] naming the field, e.g.
// `guardrails.rules[2].pattern: invalid regexp: ...`.
func (g *GuardrailsConfig) Validate(path string) []error {
	v := &validator{}
	if g.MaxScanBytes < 1 {
		v.add(path+".max_scan_bytes", "must be > 0, got %d", g.MaxScanBytes)
	}
	v.oneOf(path+".streaming_post_call", g.StreamingPostCall, StreamingReject, StreamingPassthrough)
	if len(g.Rules) > maxGuardrailRules {
		v.add(path+".rules", "at most %d rules, got %d", maxGuardrailRules, len(g.Rules))
	}
	names := map[string]int{}
	for i := range g.Rules {
		r := &g.Rules[i]
		rp := fmt.Sprintf("%s.rules[%d]", path, i)
		switch {
		case r.Name == "":
			v.add(rp+".name", "must not be empty")
		case !namePattern.MatchString(r.Name):
			v.add(rp+".name", "must match %s, got %q", namePattern, r.Name)
		default:
			if first, dup := names[r.Name]; dup {
				v.add(rp+".name", "duplicate rule %q (also %s.rules[%d])", r.Name, path, first)
			} else {
				names[r.Name] = i
			}
		}
		switch {
		case r.Builtin == "" && r.Pattern == "":
			v.add(rp, "one of builtin and pattern must be set")
		case r.Builtin != "" && r.Pattern != "":
			v.add(rp, "builtin and pattern are mutually exclusive")
		case r.Builtin != "":
			v.oneOf(rp+".builtin", r.Builtin, BuiltinEmail, BuiltinPhone, BuiltinAPIToken, BuiltinPaymentCard)
		default:
			if re, err := regexp.Compile(r.Pattern); err != nil {
				v.add(rp+".pattern", "invalid regexp: %v", err)
			} else if re.MatchString("") {
				v.add(rp+".pattern", "must not match the empty string, got %q", r.Pattern)
			}
		}
		v.oneOf(rp+".stage", r.Stage, StagePreCall, StagePostCall)
		v.oneOf(rp+".action", r.Action, ActionAnnotate, ActionBlock, ActionRedact)
		if n := utf8.RuneCountInString(r.Replacement); n > MaxReplacementChars {
			v.add(rp+".replacement", "must be at most %d characters, got %d", MaxReplacementChars, n)
		} else if r.Replacement != "" && r.Action != ActionRedact {
			v.add(rp+".replacement", "only applies to action = %q, got action %q", ActionRedact, r.Action)
		}
		if r.IncludeSystem && r.Stage == StagePostCall {
			v.add(rp+".include_system", "only applies to stage = %q", StagePreCall)
		}
		switch {
		case r.ToolCalls && r.Stage != StagePostCall:
			v.add(rp+".tool_calls", "only applies to stage = %q", StagePostCall)
		case r.ToolCalls && r.Action == ActionRedact:
			// A call whose arguments were rewritten would do something
			// else than the model asked, unseen.
			v.add(rp+".tool_calls", "applies to action %q or %q, not %q: a tool call is refused or reported, never rewritten", ActionBlock, ActionAnnotate, ActionRedact)
		}
	}
	return v.errs
}

// ValidatePlugins checks the [[plugins]] list; path is its key ("plugins").
// Names must be unique.
func ValidatePlugins(path string, plugins []PluginConfig) []error {
	v := &validator{}
	if len(plugins) > maxPlugins {
		v.add(path, "at most %d plugins, got %d", maxPlugins, len(plugins))
	}
	names := map[string]int{}
	for i := range plugins {
		p := &plugins[i]
		pp := fmt.Sprintf("%s[%d]", path, i)
		switch {
		case p.Name == "":
			v.add(pp+".name", "must not be empty")
		case !namePattern.MatchString(p.Name):
			v.add(pp+".name", "must match %s, got %q", namePattern, p.Name)
		default:
			if first, dup := names[p.Name]; dup {
				v.add(pp+".name", "duplicate plugin %q (also %s[%d])", p.Name, path, first)
			} else {
				names[p.Name] = i
			}
		}
		v.httpURL(pp+".url", p.URL)
		v.oneOf(pp+".stage", p.Stage, PluginStagePostResponse, PluginStagePreRoute, PluginStagePreUpstream)
		v.timeout(pp+".timeout_ms", p.TimeoutMS)
		v.oneOf(pp+".failure_mode", p.FailureMode, FailOpen, FailClosed)
		if p.AuthTokenEnv != "" && !envPattern.MatchString(p.AuthTokenEnv) {
			v.add(pp+".auth_token_env", "must be an environment variable name, got %q", p.AuthTokenEnv)
		}
	}
	return v.errs
}

// Validate checks the [pii_sanitizer] table; path is its key
// ("pii_sanitizer"). URLs are checked only when the sanitizer is enabled.
func (c *PIIConfig) Validate(path string) []error {
	v := &validator{}
	v.oneOf(path+".direction", c.Direction, DirectionRequest, DirectionResponse, DirectionBoth)
	v.oneOf(path+".restoration", c.Restoration, RestorationNever, RestorationTrustedDownstream, RestorationCallerAuthorized)
	v.oneOf(path+".streaming", c.Streaming, StreamingReject, StreamingPassthrough)
	v.oneOf(path+".failure_mode", c.FailureMode, FailOpen, FailClosed)
	v.timeout(path+".timeout_ms", c.TimeoutMS)
	if c.AuthTokenEnv != "" && !envPattern.MatchString(c.AuthTokenEnv) {
		v.add(path+".auth_token_env", "must be an environment variable name, got %q", c.AuthTokenEnv)
	}
	for i, e := range c.Entities {
		if e == "" {
			v.add(fmt.Sprintf("%s.entities[%d]", path, i), "must not be empty")
		}
	}
	if c.Restoration != RestorationNever && c.Direction == DirectionResponse {
		v.add(path+".restoration", "%q needs the request leg (direction = %q or %q), got direction %q",
			c.Restoration, DirectionRequest, DirectionBoth, c.Direction)
	}
	if !c.Enabled {
		return v.errs
	}
	v.httpURL(path+".url", c.URL)
	if c.Restoration != RestorationNever {
		v.httpURL(path+".restore_url", c.RestoreURL)
	}
	return v.errs
}

// Validate checks the whole delivery configuration with the default TOML
// paths (guardrails, plugins, pii_sanitizer).
func (c *Config) Validate() []error {
	var errs []error
	errs = append(errs, c.Guardrails.Validate("guardrails")...)
	errs = append(errs, ValidatePlugins("plugins", c.Plugins)...)
	errs = append(errs, c.PII.Validate("pii_sanitizer")...)
	return errs
}

// redactURL hides a URL's password in error messages.
func redactURL(s string) string {
	u, err := url.Parse(s)
	if err != nil || u.User == nil {
		return s
	}
	return u.Redacted()
}
