package config

import (
	"fmt"
	"net/url"
	"strconv"
	"strings"
)

// validateCORS checks [server.cors]. An origin must be what a browser
// sends in its Origin header, or the proxy would never match it: the
// check refuses a path or trailing slash, a default port (browsers leave
// it out), a wildcard inside a host, and "null" (the origin of every
// sandboxed page and local file).
func validateCORS(v *validator, path string, c CORS) {
	op := path + ".allowed_origins"
	for i, o := range c.AllowedOrigins {
		ip := fmt.Sprintf("%s[%d]", op, i)
		if o == "*" {
			if len(c.AllowedOrigins) > 1 {
				v.add(ip, `"*" (any origin) must be the only entry, got %d entries`, len(c.AllowedOrigins))
			}
			continue
		}
		if msg := checkOrigin(o); msg != "" {
			v.add(ip, "%s, got %q", msg, o)
		}
	}
	wildcard := len(c.AllowedOrigins) == 1 && c.AllowedOrigins[0] == "*"
	if c.AllowCredentials && wildcard {
		v.add(path+".allow_credentials", `cannot be true with allowed_origins = ["*"]: browsers refuse credentials in an answer to any origin; list the origins`)
	}
	hp := path + ".allowed_headers"
	if len(c.AllowedHeaders) == 0 && len(c.AllowedOrigins) > 0 {
		v.add(hp, `must not be empty while CORS is on (a page could not even send Content-Type: application/json); ["*"] allows the headers a preflight asks for`)
	}
	for i, h := range c.AllowedHeaders {
		ip := fmt.Sprintf("%s[%d]", hp, i)
		switch {
		case h == "*" && len(c.AllowedHeaders) > 1:
			v.add(ip, `"*" (the headers a preflight asks for) must be the only entry, got %d entries`, len(c.AllowedHeaders))
		case h != "*" && !IsToken(h):
			v.add(ip, "must be a header name, got %q", h)
		}
	}
	v.between(path+".max_age_secs", c.MaxAgeSecs, 0, MaxCORSMaxAgeSecs)
}

// checkOrigin says what is wrong with o as an origin, or "".
func checkOrigin(o string) string {
	const want = "must be an origin as browsers send it, scheme://host[:port] with no path, or \"*\""
	if o == "null" {
		return `"null" is the origin of every sandboxed page and local file, so allowing it allows them all; ` + want
	}
	u, err := url.Parse(o)
	switch {
	case err != nil || u.Scheme == "" || u.Hostname() == "" || !strings.EqualFold(u.Scheme+"://"+u.Host, o):
		return want
	case strings.Contains(u.Host, "*"):
		return "a wildcard within a host is not supported (list each origin); " + want
	}
	if p := u.Port(); p != "" {
		n, err := strconv.Atoi(p)
		switch {
		case err != nil || n < 1 || n > 65535 || strconv.Itoa(n) != p:
			return "port must be in [1, 65535], without leading zeros"
		case u.Scheme == "http" && n == 80 || u.Scheme == "https" && n == 443:
			return fmt.Sprintf("browsers send the origin without its scheme's default port: write %q", u.Scheme+"://"+strings.TrimSuffix(u.Host, ":"+p))
		}
	} else if strings.HasSuffix(u.Host, ":") {
		return want
	}
	return ""
}

// IsToken reports whether s is an RFC 9110 token: what a header name or a
// method may be.
func IsToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return true
}
