package gateway

import (
	"encoding/json"
)

// The gateway looks at a few top-level fields of bodies it otherwise passes
// on untouched. Decoding a whole body into maps to find them costs more
// than the rest of the request's handling in the gateway, so these helpers
// walk a body that json.Valid accepted and hand out the raw members,
// exactly as json.Unmarshal into map[string]json.RawMessage would (the
// last of duplicate keys wins, escaped keys are unescaped).

// eachMember calls fn with the key and raw value of each member of the
// object raw, in order. raw must be valid JSON (json.Valid) whose first
// non-space byte is '{'.
func eachMember(raw []byte, fn func(key string, val json.RawMessage)) {
	i := skipSpace(raw, 0) + 1 // past '{'
	for {
		i = skipSpace(raw, i)
		if raw[i] == '}' {
			return
		}
		if raw[i] == ',' {
			i = skipSpace(raw, i+1)
		}
		keyEnd := skipString(raw, i)
		key := unquoteKey(raw[i:keyEnd])
		i = skipSpace(raw, keyEnd) + 1 // past ':'
		i = skipSpace(raw, i)
		end := skipValue(raw, i)
		fn(key, raw[i:end:end])
		i = end
	}
}

// eachElement calls fn with each raw element of the array raw, in order.
// raw must be valid JSON whose first non-space byte is '['.
func eachElement(raw []byte, fn func(val json.RawMessage)) {
	i := skipSpace(raw, 0) + 1 // past '['
	for {
		i = skipSpace(raw, i)
		if raw[i] == ']' {
			return
		}
		if raw[i] == ',' {
			i = skipSpace(raw, i+1)
		}
		end := skipValue(raw, i)
		fn(raw[i:end:end])
		i = end
	}
}

// unquoteKey returns the string a quoted JSON key stands for. Plain ASCII
// is taken as it is; escapes and other bytes (which json.Unmarshal checks
// for valid UTF-8) go through json.Unmarshal.
func unquoteKey(q []byte) string {
	for _, c := range q[1 : len(q)-1] {
		if c == '\\' || c >= 0x80 {
			var s string
			_ = json.Unmarshal(q, &s) // valid JSON string: cannot fail
			return s
		}
	}
	return string(q[1 : len(q)-1])
}

// unquoteString is unquoteKey for string values.
func unquoteString(q []byte) string { return unquoteKey(q) }

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\r' || b[i] == '\n') {
		i++
	}
	return i
}

// skipString returns the index just past the string that starts at b[i].
func skipString(b []byte, i int) int {
	for i++; i < len(b); i++ {
		switch b[i] {
		case '\\':
			i++ // the escaped byte cannot end the string
		case '"':
			return i + 1
		}
	}
	return i
}

// skipValue returns the index just past the value that starts at b[i].
func skipValue(b []byte, i int) int {
	switch b[i] {
	case '"':
		return skipString(b, i)
	case '{', '[':
		depth := 0
		for i < len(b) {
			switch b[i] {
			case '"':
				i = skipString(b, i)
				continue
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return i + 1
				}
			}
			i++
		}
		return i
	default: // number, true, false, null
		for i < len(b) {
			switch b[i] {
			case ',', '}', ']', ' ', '\t', '\r', '\n':
				return i
			}
			i++
		}
		return i
	}
}
