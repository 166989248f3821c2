package check

import (
	"bytes"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestReportPrintsErrorsFirstAndCounts(t *testing.T) {
	var r Report
	r.Warnf("w-rule", "obj", "a %s", "warning")
	r.Errorf("e-rule", "", "an error")
	r.Errorf("e-rule", "x", "another")
	var buf bytes.Buffer
	if err := r.Print(&buf); err != nil {
		t.Fatal(err)
	}
	want := "error [e-rule] an error\nerror [e-rule] x: another\nwarning [w-rule] obj: a warning\n2 error(s), 1 warning(s)\n"
	if d := cmp.Diff(want, buf.String()); d != "" {
		t.Errorf("Print (-want +got):\n%s", d)
	}
	if !r.HasErrors() || len(r.Warnings()) != 1 {
		t.Errorf("HasErrors=%v warnings=%d", r.HasErrors(), len(r.Warnings()))
	}
	if d := cmp.Diff([]string{"e-rule"}, r.Rules(Error)); d != "" {
		t.Errorf("Rules(Error) (-want +got):\n%s", d)
	}
	var empty Report
	if empty.HasErrors() {
		t.Error("an empty report has errors")
	}
}
