package clientkeys

import "strings"

// The request headers FromHeaders reads, in their canonical form (what net/http's Header.Get
// expects; fasthttp's Peek ignores case).
const (
	headerAuthorization = "Authorization"
	headerAPIKey        = "X-Api-Key"
)

// FromHeaders returns the key a request presents, reading its headers through get (which
// returns "" for an absent header): the token of an "Authorization: Bearer <token>" header, the
// scheme name in any letter case (RFC 9110, section 11.1); failing that, the value of
// "X-Api-Key" (the header Anthropic clients send), with surrounding blanks trimmed; failing
// that, "". An Authorization header with another scheme, no token, or a token with blanks
// inside carries no bearer token, so X-Api-Key is used when both are sent and Authorization is
// not a well-formed bearer token.
func FromHeaders(get func(name string) string) string {
	if token, ok := bearerToken(get(headerAuthorization)); ok {
		return token
	}
	return strings.Trim(get(headerAPIKey), " \t")
}

// bearerToken returns the token of an Authorization header value with the Bearer scheme.
func bearerToken(v string) (string, bool) {
	scheme, token, ok := strings.Cut(strings.Trim(v, " \t"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	token = strings.TrimLeft(token, " ")
	if token == "" || strings.ContainsAny(token, " \t") {
		return "", false
	}
	return token, true
}
