package catalog

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"sort"

	"github.com/blang/semver/v4"
	"sigs.k8s.io/yaml"
)

// SchemaSemver is the schema of a semver catalog template.
const SchemaSemver = "olm.semver"

// StreamType selects major (stable-v1) or minor (stable-v1.2) channels.
type StreamType string

// Stream types.
const (
	StreamDefault StreamType = ""
	StreamMinor   StreamType = "minor"
	StreamMajor   StreamType = "major"
)

// SemverTemplate is the olm.semver catalog template. Keys match
// case-insensitively (the upstream README spells them GenerateMajorChannels,
// Candidate.Bundles[].Image), and unknown keys are an error.
type SemverTemplate struct {
	Schema                       string         `json:"schema"`
	GenerateMajorChannels        bool           `json:"generateMajorChannels,omitempty"`
	GenerateMinorChannels        bool           `json:"generateMinorChannels,omitempty"`
	DefaultChannelTypePreference StreamType     `json:"defaultChannelTypePreference,omitempty"`
	Candidate                    ChannelBundles `json:"candidate,omitempty"`
	Fast                         ChannelBundles `json:"fast,omitempty"`
	Stable                       ChannelBundles `json:"stable,omitempty"`
}

// ChannelBundles lists the bundle images of one channel archetype.
type ChannelBundles struct {
	Bundles []TemplateBundle `json:"bundles,omitempty"`
}

// TemplateBundle is one bundle image reference.
type TemplateBundle struct {
	Image string `json:"image"`
}

// ParseTemplate reads a semver template strictly and applies its defaults:
// with neither generate option set, minor channels are generated; the
// default channel preference follows the generated kind, and a preference
// for a kind that is not generated is an error.
func ParseTemplate(data []byte) (*SemverTemplate, error) {
	t := &SemverTemplate{}
	js, err := yaml.YAMLToJSON(data)
	if err != nil {
		return nil, fmt.Errorf("parsing semver template: %w", err)
	}
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.DisallowUnknownFields()
	if err := dec.Decode(t); err != nil {
		return nil, fmt.Errorf("parsing semver template: %w", err)
	}
	if t.Schema != SchemaSemver {
		return nil, fmt.Errorf("semver template has schema %q, want %q", t.Schema, SchemaSemver)
	}
	if !t.GenerateMajorChannels && !t.GenerateMinorChannels {
		t.GenerateMinorChannels = true
	}
	switch t.DefaultChannelTypePreference {
	case StreamDefault:
		if t.GenerateMinorChannels {
			t.DefaultChannelTypePreference = StreamMinor
		} else {
			t.DefaultChannelTypePreference = StreamMajor
		}
	case StreamMinor:
		if !t.GenerateMinorChannels {
			return nil, errors.New("defaultChannelTypePreference is minor but minor channels are not generated")
		}
	case StreamMajor:
		if !t.GenerateMajorChannels {
			return nil, errors.New("defaultChannelTypePreference is major but major channels are not generated")
		}
	default:
		return nil, fmt.Errorf("defaultChannelTypePreference %q is neither major nor minor", t.DefaultChannelTypePreference)
	}
	return t, nil
}

// archetype is a channel stability class.
type archetype string

const (
	candidate archetype = "candidate"
	fast      archetype = "fast"
	stable    archetype = "stable"
)

// archetypes in increasing stability.
var archetypes = []archetype{candidate, fast, stable}

var archetypeRank = map[archetype]int{candidate: 0, fast: 1, stable: 2}

var streamRank = map[StreamType]int{StreamDefault: 0, StreamMajor: 1, StreamMinor: 2}

func (t *SemverTemplate) bundlesOf(a archetype) []TemplateBundle {
	switch a {
	case candidate:
		return t.Candidate.Bundles
	case fast:
		return t.Fast.Bundles
	}
	return t.Stable.Bundles
}

// Images returns every bundle image the template names, sorted.
func (t *SemverTemplate) Images() []string {
	seen := map[string]bool{}
	var out []string
	for _, a := range archetypes {
		for _, b := range t.bundlesOf(a) {
			if !seen[b.Image] {
				seen[b.Image] = true
				out = append(out, b.Image)
			}
		}
	}
	sort.Strings(out)
	return out
}

// BundleSource turns a template image into its olm.bundle.
type BundleSource func(image string) (Bundle, error)

// Render renders the template: one olm.bundle per image, the channels
// (candidate|fast|stable-vX and/or -vX.Y) with the semver template's edges,
// and the olm.package with the most stable channel as default.
func Render(t *SemverTemplate, source BundleSource) (*DeclarativeConfig, error) {
	cfg := &DeclarativeConfig{}
	byImage := map[string]Bundle{}
	for _, img := range t.Images() {
		if img == "" {
			return nil, errors.New("semver template: a bundle has no image")
		}
		b, err := source(img)
		if err != nil {
			return nil, fmt.Errorf("rendering bundle %s: %w", img, err)
		}
		byImage[img] = b
		cfg.Bundles = append(cfg.Bundles, b)
	}
	if len(cfg.Bundles) == 0 {
		return nil, errors.New("semver template lists no bundles")
	}

	pkg := ""
	versions := map[archetype]map[string]semver.Version{}
	for _, a := range archetypes {
		versions[a] = map[string]semver.Version{}
		stripped := map[string]string{}
		for _, tb := range t.bundlesOf(a) {
			b := byImage[tb.Image]
			pp, err := packageProperties(b)
			if err != nil {
				return nil, err
			}
			if len(pp) != 1 {
				return nil, fmt.Errorf("bundle %s has %d olm.package properties, want 1", b.Name, len(pp))
			}
			v, err := semver.Parse(pp[0].Version)
			if err != nil {
				return nil, fmt.Errorf("bundle %s has invalid version %q: %w", b.Name, pp[0].Version, err)
			}
			if pkg == "" {
				pkg = pp[0].PackageName
			} else if pp[0].PackageName != pkg {
				return nil, fmt.Errorf("bundle %s belongs to package %q, not %q", b.Name, pp[0].PackageName, pkg)
			}
			if _, dup := versions[a][b.Name]; dup {
				return nil, fmt.Errorf("bundle %s is listed twice in %s", b.Name, a)
			}
			noBuild := v
			noBuild.Build = nil
			if other, ok := stripped[noBuild.String()]; ok {
				return nil, fmt.Errorf("bundles %s and %s differ only by build metadata, which cannot be ordered", other, b.Name)
			}
			stripped[noBuild.String()] = b.Name
			versions[a][b.Name] = v
		}
	}

	channels, def := t.channels(pkg, versions)
	cfg.Channels = channels
	cfg.Packages = []Package{{Schema: SchemaPackage, Name: pkg, DefaultChannel: def}}
	return cfg, nil
}

// entryRef locates a channel entry for linking.
type entryRef struct {
	arch    archetype
	kind    StreamType
	channel string
	name    string
	version semver.Version
	index   int
}

// channels builds the channels and their edges, and picks the default
// channel. The edges follow opm's semver template:
//   - entries are walked per archetype and stream kind in version order;
//   - within one major version, the highest-Z entry of each Y gets
//     replaces: the highest-Z entry of the previous Y, and skips: every
//     earlier entry of that major run except the replaced one;
//   - lower-Z entries get no edges (the highest Z skips them);
//   - nothing links across a change of archetype, kind or major version.
func (t *SemverTemplate) channels(pkg string, versions map[archetype]map[string]semver.Version) ([]Channel, string) {
	chans := map[string]*Channel{}
	var refs []entryRef
	type high struct {
		arch    archetype
		kind    StreamType
		version semver.Version
		name    string
	}
	hw := high{arch: candidate}
	better := func(c high) bool {
		if archetypeRank[c.arch] != archetypeRank[hw.arch] {
			return archetypeRank[c.arch] > archetypeRank[hw.arch]
		}
		if !c.version.EQ(hw.version) {
			return c.version.GT(hw.version)
		}
		if c.kind != hw.kind {
			if c.kind == t.DefaultChannelTypePreference {
				return true
			}
			if hw.kind == t.DefaultChannelTypePreference {
				return false
			}
			return streamRank[c.kind] > streamRank[hw.kind]
		}
		return false
	}
	for _, a := range archetypes {
		names := make([]string, 0, len(versions[a]))
		for n := range versions[a] {
			names = append(names, n)
		}
		sort.Slice(names, func(i, j int) bool { return versions[a][names[i]].LT(versions[a][names[j]]) })
		for _, n := range names {
			v := versions[a][n]
			var kinds []StreamType
			if t.GenerateMajorChannels {
				kinds = append(kinds, StreamMajor)
			}
			if t.GenerateMinorChannels {
				kinds = append(kinds, StreamMinor)
			}
			for _, k := range kinds {
				name := fmt.Sprintf("%s-v%d", a, v.Major)
				if k == StreamMinor {
					name = fmt.Sprintf("%s-v%d.%d", a, v.Major, v.Minor)
				}
				ch, ok := chans[name]
				if !ok {
					ch = &Channel{Schema: SchemaChannel, Package: pkg, Name: name, Entries: []ChannelEntry{}}
					chans[name] = ch
					if c := (high{arch: a, kind: k, version: v, name: name}); better(c) {
						hw = c
					}
				}
				ch.Entries = append(ch.Entries, ChannelEntry{Name: n})
				refs = append(refs, entryRef{arch: a, kind: k, channel: name, name: n, version: v, index: len(ch.Entries) - 1})
			}
		}
	}
	link(chans, refs)
	out := make([]Channel, 0, len(chans))
	for _, ch := range chans {
		out = append(out, *ch)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, hw.name
}

// link writes the replaces and skips edges (see channels).
func link(chans map[string]*Channel, refs []entryRef) {
	sort.SliceStable(refs, func(i, j int) bool {
		a, b := refs[i], refs[j]
		if archetypeRank[a.arch] != archetypeRank[b.arch] {
			return archetypeRank[a.arch] < archetypeRank[b.arch]
		}
		if streamRank[a.kind] != streamRank[b.kind] {
			return streamRank[a.kind] < streamRank[b.kind]
		}
		if !a.version.EQ(b.version) {
			return a.version.LT(b.version)
		}
		return a.channel < b.channel
	})
	// setEdges gives the entry r its replaces and skips.
	setEdges := func(r entryRef, replaces string, skips map[string]bool) {
		e := &chans[r.channel].Entries[r.index]
		e.Replaces = replaces
		var s []string
		for n := range skips {
			if n != replaces {
				s = append(s, n)
			}
		}
		sort.Strings(s)
		e.Skips = s
	}
	prevYMax := ""
	skips := map[string]bool{}
	for i := 1; i < len(refs); i++ {
		prev, cur := refs[i-1], refs[i]
		runChange := prev.arch != cur.arch || prev.kind != cur.kind || prev.version.Major != cur.version.Major
		yChange := prev.version.Minor != cur.version.Minor
		if runChange || yChange {
			// prev is the highest Z of its Y: it gets the edges.
			setEdges(prev, prevYMax, skips)
		}
		if runChange {
			prevYMax = ""
			skips = map[string]bool{}
			continue
		}
		if yChange {
			prevYMax = prev.name
		}
		skips[prev.name] = true
	}
	if n := len(refs); n > 1 {
		last, before := refs[n-1], refs[n-2]
		if last.arch == before.arch && last.kind == before.kind && last.version.Major == before.version.Major {
			setEdges(last, prevYMax, skips)
		}
	}
}
