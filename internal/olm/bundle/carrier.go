package bundle

import (
	"fmt"
	"strings"

	"github.com/blang/semver/v4"
	"github.com/operator-framework/api/pkg/lib/version"

	"github.com/model-orchestra/operator/internal/olm/manifest"
)

// A CRD carrier is a patch release of an older release line that changes
// nothing but the CRDs it ships: they become the current release's. Every
// bundle a catalog offers then ships the same CRDs, so installing any of
// them after any other (versions side by side share one CRD object, and
// the last install wins) never drops a field that another version's users
// stored. See docs/olm.md, "No install order loses data".

// Carrier returns the patch release version of the line of from, whose
// CRDs are replaced by those of current that from also ships (a CRD that
// from does not ship is left to the versions that do: OLM never deletes a
// CRD). The CSV is from's with a new name and version, replacing from, and
// its olm.skipRange's upper bound raised to version; the operator image,
// environment, permissions and channels stay from's: the line's code does
// not change.
func Carrier(from, current *Bundle, v string) (*Bundle, error) {
	ver, err := semver.Parse(v)
	if err != nil {
		return nil, fmt.Errorf("carrier version: %w", err)
	}
	prev, err := semver.Parse(from.CSV.Spec.Version.String())
	if err != nil {
		return nil, fmt.Errorf("%s: %w", from.CSV.Name, err)
	}
	if ver.Major != prev.Major || !ver.GT(prev) {
		return nil, fmt.Errorf("carrier %s must be a later release of the line of %s (same major version)", ver, prev)
	}
	curFiles := map[string][]byte{}
	for _, f := range current.Files {
		curFiles[f.Name] = f.Data
	}
	curCRDs := map[string]bool{}
	for _, c := range current.CRDs {
		curCRDs[c.Name] = true
	}
	pkg := from.Package()
	csv := from.CSV.DeepCopy()
	csv.Name = CSVName(pkg, ver.String())
	csv.Spec.Version = version.OperatorVersion{Version: ver}
	csv.Spec.Replaces = from.CSV.Name
	csv.Spec.Skips = nil
	if sr := csv.Annotations[manifest.AnnotationSkipRange]; sr != "" {
		fields := strings.Fields(sr)
		if len(fields) != 2 || !strings.HasPrefix(fields[1], "<") {
			return nil, fmt.Errorf("%s: cannot raise olm.skipRange %q (want \">=A <B\")", from.CSV.Name, sr)
		}
		csv.Annotations[manifest.AnnotationSkipRange] = fields[0] + " <" + ver.String()
	}
	csvData, err := MarshalCSV(csv)
	if err != nil {
		return nil, err
	}
	out := &Bundle{Annotations: from.Annotations}
	for _, f := range from.Files {
		docs, err := manifest.Documents(f.Data)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", f.Name, err)
		}
		kind, name := "", ""
		if len(docs) == 1 {
			objs, err := manifest.Objects(docs[0])
			if err != nil {
				return nil, fmt.Errorf("%s: %w", f.Name, err)
			}
			kind, name = objs[0].GetKind(), objs[0].GetName()
		}
		switch {
		case kind == "ClusterServiceVersion":
			out.Files = append(out.Files, File{Name: f.Name, Data: csvData})
		case kind == "CustomResourceDefinition" && curCRDs[name]:
			data, ok := curFiles[f.Name]
			if !ok {
				return nil, fmt.Errorf("the current bundle ships CRD %s in another file than %s", name, f.Name)
			}
			out.Files = append(out.Files, File{Name: f.Name, Data: data})
		default:
			out.Files = append(out.Files, f)
		}
	}
	if err := out.decodeFiles(); err != nil {
		return nil, fmt.Errorf("carrier %s: %w", ver, err)
	}
	return out, nil
}
