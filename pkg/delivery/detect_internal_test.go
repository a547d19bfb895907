package delivery

import (
	"regexp"
	"slices"
	"strings"
	"testing"
)

func TestBuiltinDetectors(t *testing.T) {
	tests := []struct {
		name    string
		builtin string
		text    string
		want    []string // the matched substrings, in order
	}{
		// email
		{"email: plain", BuiltinEmail, "write to john.doe@example.com today", []string{"john.doe@example.com"}},
		{"email: plus tag and subdomains", BuiltinEmail, "a_b+tag@mail.sub.example.co.uk.", []string{"a_b+tag@mail.sub.example.co.uk"}},
		{"email: two", BuiltinEmail, "x@example.org, y@example.net", []string{"x@example.org", "y@example.net"}},
		{"email: near miss: no dot in domain", BuiltinEmail, "user@localhost", nil},
		{"email: near miss: one-letter tld", BuiltinEmail, "a@b.c", nil},
		{"email: near miss: handle", BuiltinEmail, "ping @example.com on chat", nil},
		{"email: near miss: tld glued to digits", BuiltinEmail, "foo@bar.com1", nil},
		{"email: near miss: no at", BuiltinEmail, "visit example.com", nil},

		// phone
		{"phone: NANP dashes", BuiltinPhone, "call 555-123-4567 now", []string{"555-123-4567"}},
		{"phone: NANP parens", BuiltinPhone, "call (555) 123-4567", []string{"(555) 123-4567"}},
		{"phone: NANP dots", BuiltinPhone, "555.123.4567", []string{"555.123.4567"}},
		{"phone: international with spaces", BuiltinPhone, "tel +44 20 7946 0958.", []string{"+44 20 7946 0958"}},
		{"phone: international compact", BuiltinPhone, "tel:+4915112345678", []string{"+4915112345678"}},
		{"phone: country code and parens", BuiltinPhone, "+1 (555) 123-4567", []string{"+1 (555) 123-4567"}},
		{"phone: national with trunk zero", BuiltinPhone, "ring 020 7946 0958", []string{"020 7946 0958"}},
		{"phone: near miss: bare digits", BuiltinPhone, "id 5551234567", nil},
		{"phone: near miss: unix timestamp", BuiltinPhone, "at 1700000000", nil},
		{"phone: near miss: date", BuiltinPhone, "on 2024-01-15", nil},
		{"phone: near miss: ssn shape", BuiltinPhone, "ssn 123-45-6789", nil},
		{"phone: near miss: ipv4", BuiltinPhone, "host 192.168.100.200", nil},
		{"phone: near miss: short international", BuiltinPhone, "+1234567", nil},
		{"phone: near miss: card number", BuiltinPhone, "4111 1111 1111 1111", nil},
		{"phone: near miss: longer digit run", BuiltinPhone, "12345-67890-12345", nil},
		{"phone: near miss: version", BuiltinPhone, "v1.2.3", nil},

		// api_token
		{"api_token: openai project key", BuiltinAPIToken, "key sk-proj-abc123DEF456ghi789JKL012mno345 end", []string{"sk-proj-abc123DEF456ghi789JKL012mno345"}},
		{"api_token: anthropic key", BuiltinAPIToken, "sk-ant-api03-AbCdEf1234567890AbCdEf1234567890", []string{"sk-ant-api03-AbCdEf1234567890AbCdEf1234567890"}},
		{"api_token: github", BuiltinAPIToken, "ghp_" + strings.Repeat("a1B2", 9), []string{"ghp_" + strings.Repeat("a1B2", 9)}},
		{"api_token: aws access key id", BuiltinAPIToken, "AKIAIOSFODNN7EXAMPLE", []string{"AKIAIOSFODNN7EXAMPLE"}},
		{"api_token: slack", BuiltinAPIToken, "xoxb-1234567890-abcdefghij", []string{"xoxb-1234567890-abcdefghij"}},
		{"api_token: google", BuiltinAPIToken, "AIza" + strings.Repeat("x9", 17) + "Q", []string{"AIza" + strings.Repeat("x9", 17) + "Q"}},
		{"api_token: stripe", BuiltinAPIToken, "sk_live_4eC39HqLyjWDarjtT1zdp7dc", []string{"sk_live_4eC39HqLyjWDarjtT1zdp7dc"}},
		{"api_token: hugging face", BuiltinAPIToken, "hf_" + strings.Repeat("aB3", 11), []string{"hf_" + strings.Repeat("aB3", 11)}},
		{"api_token: jwt", BuiltinAPIToken, "Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
			[]string{"eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U"}},
		{"api_token: near miss: short sk", BuiltinAPIToken, "sk-abc123", nil},
		{"api_token: near miss: hyphenated phrase", BuiltinAPIToken, "sk-this-is-a-very-long-hyphenated-phrase", nil},
		{"api_token: near miss: glued to a word", BuiltinAPIToken, "risk-abc123DEF456ghi789JKL012mno345", nil},
		{"api_token: near miss: short aws", BuiltinAPIToken, "AKIA1234", nil},
		{"api_token: near miss: short github", BuiltinAPIToken, "ghp_abc123", nil},

		// payment_card
		{"card: visa spaced", BuiltinPaymentCard, "card 4111 1111 1111 1111 exp", []string{"4111 1111 1111 1111"}},
		{"card: visa dashed", BuiltinPaymentCard, "4111-1111-1111-1111", []string{"4111-1111-1111-1111"}},
		{"card: visa compact", BuiltinPaymentCard, "n=4111111111111111;", []string{"4111111111111111"}},
		{"card: mastercard", BuiltinPaymentCard, "5500 0000 0000 0004", []string{"5500 0000 0000 0004"}},
		{"card: amex 15 digits", BuiltinPaymentCard, "378282246310005", []string{"378282246310005"}},
		{"card: discover", BuiltinPaymentCard, "6011111111111117", []string{"6011111111111117"}},
		{"card: near miss: luhn fails", BuiltinPaymentCard, "4111 1111 1111 1112", nil},
		{"card: near miss: too short", BuiltinPaymentCard, "411111111111", nil},
		{"card: near miss: part of a longer number", BuiltinPaymentCard, "94111111111111111", nil},
		{"card: near miss: 22 digits", BuiltinPaymentCard, "4111111111111111111111", nil},
		{"card: near miss: network prefix", BuiltinPaymentCard, "1111 1111 1111 1117", nil},
		{"card: near miss: glued to letters", BuiltinPaymentCard, "id4111111111111111", nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			det, _ := builtinDetector(tc.builtin)
			var got []string
			for _, m := range det.find(tc.text) {
				got = append(got, tc.text[m[0]:m[1]])
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("find(%q) = %q, want %q", tc.text, got, tc.want)
			}
		})
	}
}

func TestLuhn(t *testing.T) {
	tests := []struct {
		in   string
		want bool
	}{
		{"79927398713", true},
		{"79927398710", false},
		{"4111 1111 1111 1111", true},
		{"0", true},
		{"", false},
	}
	for _, tc := range tests {
		if got := luhn(tc.in); got != tc.want {
			t.Errorf("luhn(%q) = %v, want %v", tc.in, got, tc.want)
		}
	}
}

func TestPatternDetectorSkipsEmptyMatches(t *testing.T) {
	det := reDetector{re: regexp.MustCompile(`x*`)}
	got := det.find("axxbx")
	want := [][2]int{{1, 3}, {4, 5}}
	if !slices.Equal(got, want) {
		t.Errorf("find = %v, want %v", got, want)
	}
}
