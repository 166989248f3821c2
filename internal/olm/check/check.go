// Package check holds the findings that the OLM validators (bundle, catalog,
// CRD compatibility) report, and how they are printed.
package check

import (
	"fmt"
	"io"
	"sort"
)

// Severity says whether a finding fails validation.
type Severity string

const (
	// Error fails validation.
	Error Severity = "error"
	// Warning is printed but does not fail validation.
	Warning Severity = "warning"
)

// Finding is one problem found by a validator.
type Finding struct {
	Severity Severity
	// Rule is a stable identifier of the check, for example
	// "csv-installmodes" or "catalog-single-head"; tests and users grep it.
	Rule string
	// Object names what the finding is about, for example the CSV name or
	// "channel stable-v1".
	Object string
	// Message says what is wrong and, where possible, how to fix it.
	Message string
}

func (f Finding) String() string {
	obj := ""
	if f.Object != "" {
		obj = f.Object + ": "
	}
	return fmt.Sprintf("%s [%s] %s%s", f.Severity, f.Rule, obj, f.Message)
}

// Report collects findings.
type Report struct {
	Findings []Finding
}

// Errorf records an error.
func (r *Report) Errorf(rule, object, format string, args ...any) {
	r.Findings = append(r.Findings, Finding{Severity: Error, Rule: rule, Object: object, Message: fmt.Sprintf(format, args...)})
}

// Warnf records a warning.
func (r *Report) Warnf(rule, object, format string, args ...any) {
	r.Findings = append(r.Findings, Finding{Severity: Warning, Rule: rule, Object: object, Message: fmt.Sprintf(format, args...)})
}

// Merge appends the findings of o.
func (r *Report) Merge(o Report) {
	r.Findings = append(r.Findings, o.Findings...)
}

// Errors returns the error findings.
func (r Report) Errors() []Finding { return r.filter(Error) }

// Warnings returns the warning findings.
func (r Report) Warnings() []Finding { return r.filter(Warning) }

// HasErrors reports whether any finding is an error.
func (r Report) HasErrors() bool { return len(r.Errors()) > 0 }

// Rules returns the sorted, de-duplicated rule identifiers of the findings
// of severity s.
func (r Report) Rules(s Severity) []string {
	seen := map[string]bool{}
	var out []string
	for _, f := range r.filter(s) {
		if !seen[f.Rule] {
			seen[f.Rule] = true
			out = append(out, f.Rule)
		}
	}
	sort.Strings(out)
	return out
}

func (r Report) filter(s Severity) []Finding {
	var out []Finding
	for _, f := range r.Findings {
		if f.Severity == s {
			out = append(out, f)
		}
	}
	return out
}

// Print writes the findings, errors first, one per line, and a summary line.
func (r Report) Print(w io.Writer) error {
	for _, f := range append(r.Errors(), r.Warnings()...) {
		if _, err := fmt.Fprintln(w, f.String()); err != nil {
			return err
		}
	}
	_, err := fmt.Fprintf(w, "%d error(s), %d warning(s)\n", len(r.Errors()), len(r.Warnings()))
	return err
}
