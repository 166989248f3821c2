package catalog

import (
	"bytes"
	"encoding/json"
	"net/http"
	"sort"
	"strings"

	"github.com/blang/semver/v4"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/model-orchestra/operator/internal/olm/check"
)

// Validate applies the rules of `opm validate` (operator-registry's
// declcfg-to-model conversion and model validation) to a catalog:
// unique packages, channels, entries and bundles; references to known
// packages; exactly one olm.package property per bundle, matching its
// package; every bundle in a channel and every entry backed by a bundle;
// an existing default channel; exactly one channel head; a replaces chain
// from the head that reaches every entry not skipped, without cycles;
// parsable skipRanges; no empty skips; unique versions per package; bundle
// images set. It also checks that icons are what their media type says.
func Validate(cfg *DeclarativeConfig) check.Report {
	var r check.Report
	pkgs := map[string]*Package{}
	for i := range cfg.Packages {
		p := &cfg.Packages[i]
		obj := "package " + p.Name
		if p.Name == "" {
			r.Errorf("fbc-package-name", obj, "package name must not be empty")
		}
		for _, msg := range validation.IsDNS1123Label(p.Name) {
			r.Errorf("fbc-package-name", obj, "package name is not a DNS-1123 label: %s", msg)
		}
		if pkgs[p.Name] != nil {
			r.Errorf("fbc-duplicate", obj, "package is defined twice")
		}
		pkgs[p.Name] = p
		validateIcon(&r, obj, p.Icon)
	}

	type chanKey struct{ pkg, name string }
	chans := map[chanKey]*Channel{}
	inChannel := map[string]map[string]bool{} // package -> bundle -> in some channel
	for i := range cfg.Channels {
		ch := &cfg.Channels[i]
		obj := "channel " + ch.Package + "/" + ch.Name
		if ch.Name == "" {
			r.Errorf("fbc-channel-name", obj, "channel name must not be empty")
		}
		if pkgs[ch.Package] == nil {
			r.Errorf("fbc-unknown-package", obj, "channel belongs to package %q, which is not defined", ch.Package)
		}
		k := chanKey{ch.Package, ch.Name}
		if chans[k] != nil {
			r.Errorf("fbc-duplicate", obj, "channel is defined twice")
		}
		chans[k] = ch
		if inChannel[ch.Package] == nil {
			inChannel[ch.Package] = map[string]bool{}
		}
		for _, e := range ch.Entries {
			inChannel[ch.Package][e.Name] = true
		}
	}

	type bundleKey struct{ pkg, name string }
	bundles := map[bundleKey]*Bundle{}
	versions := map[string]map[string]string{} // package -> version -> bundle
	for i := range cfg.Bundles {
		b := &cfg.Bundles[i]
		obj := "bundle " + b.Name
		if b.Name == "" {
			r.Errorf("fbc-bundle-name", obj, "bundle name must not be empty")
		}
		if pkgs[b.Package] == nil {
			r.Errorf("fbc-unknown-package", obj, "bundle belongs to package %q, which is not defined", b.Package)
		}
		k := bundleKey{b.Package, b.Name}
		if bundles[k] != nil {
			r.Errorf("fbc-duplicate", obj, "bundle is defined twice")
		}
		bundles[k] = b
		if b.Image == "" {
			r.Errorf("fbc-bundle-image", obj, "bundle image must be set")
		}
		pp, err := packageProperties(*b)
		if err != nil {
			r.Errorf("fbc-bundle-properties", obj, "%v", err)
		} else if len(pp) != 1 {
			r.Errorf("fbc-bundle-properties", obj, "must have exactly one olm.package property, has %d", len(pp))
		} else {
			if pp[0].PackageName != b.Package {
				r.Errorf("fbc-bundle-properties", obj, "olm.package property names package %q, the bundle belongs to %q", pp[0].PackageName, b.Package)
			}
			v, err := semver.Parse(pp[0].Version)
			if err != nil {
				r.Errorf("fbc-bundle-properties", obj, "olm.package version %q is not semver: %v", pp[0].Version, err)
			} else {
				if versions[b.Package] == nil {
					versions[b.Package] = map[string]string{}
				}
				if other, dup := versions[b.Package][v.String()]; dup {
					r.Errorf("fbc-version-unique", obj, "version %s is also the version of bundle %s", v, other)
				}
				versions[b.Package][v.String()] = b.Name
			}
		}
		validateProperties(&r, obj, b.Properties)
		if !inChannel[b.Package][b.Name] {
			r.Errorf("fbc-bundle-in-channel", obj, "bundle is not an entry of any channel of package %q", b.Package)
		}
		if !hasBundleObject(b) {
			r.Warnf("fbc-bundle-object", obj, "no olm.bundle.object property: OLM v0 catalog clients cannot show or install it without pulling the image")
		}
	}

	// Channels: entries, heads, chains.
	chanKeys := make([]chanKey, 0, len(chans))
	for k := range chans {
		chanKeys = append(chanKeys, k)
	}
	sort.Slice(chanKeys, func(i, j int) bool {
		return chanKeys[i].pkg+"/"+chanKeys[i].name < chanKeys[j].pkg+"/"+chanKeys[j].name
	})
	for _, k := range chanKeys {
		ch := chans[k]
		obj := "channel " + ch.Package + "/" + ch.Name
		if len(ch.Entries) == 0 {
			r.Errorf("fbc-channel-entries", obj, "channel must contain at least one entry")
			continue
		}
		seen := map[string]bool{}
		for _, e := range ch.Entries {
			if seen[e.Name] {
				r.Errorf("fbc-duplicate", obj, "entry %s is listed twice", e.Name)
			}
			seen[e.Name] = true
			if bundles[bundleKey{ch.Package, e.Name}] == nil {
				r.Errorf("fbc-entry-bundle", obj, "entry %s has no olm.bundle in package %q", e.Name, ch.Package)
			}
			for i, s := range e.Skips {
				if s == "" {
					r.Errorf("fbc-empty-skip", obj, "entry %s: skips[%d] is empty", e.Name, i)
				}
			}
			if e.SkipRange != "" {
				if _, err := semver.ParseRange(e.SkipRange); err != nil {
					r.Errorf("fbc-skip-range", obj, "entry %s: skipRange %q does not parse: %v", e.Name, e.SkipRange, err)
				}
			}
		}
		validateChain(&r, obj, ch)
	}

	// Packages: default channel.
	for _, p := range cfg.Packages {
		obj := "package " + p.Name
		n := 0
		for k := range chans {
			if k.pkg == p.Name {
				n++
			}
		}
		if n == 0 {
			r.Errorf("fbc-package-channels", obj, "package must contain at least one channel")
		}
		switch {
		case p.DefaultChannel == "":
			r.Errorf("fbc-default-channel", obj, "default channel must be set")
		case chans[chanKey{p.Name, p.DefaultChannel}] == nil:
			r.Errorf("fbc-default-channel", obj, "default channel %q is not a channel of the package", p.DefaultChannel)
		}
	}
	return r
}

// validateChain applies opm's replaces-chain rules to one channel.
func validateChain(r *check.Report, obj string, ch *Channel) {
	entries := map[string]ChannelEntry{}
	incoming := map[string]bool{}
	skipped := map[string]bool{}
	for _, e := range ch.Entries {
		entries[e.Name] = e
		if e.Replaces != "" {
			incoming[e.Replaces] = true
		}
		for _, s := range e.Skips {
			incoming[s] = true
			skipped[s] = true
		}
	}
	var heads []string
	for _, e := range ch.Entries {
		if !incoming[e.Name] {
			heads = append(heads, e.Name)
		}
	}
	sort.Strings(heads)
	switch len(heads) {
	case 0:
		r.Errorf("fbc-channel-head", obj, "no channel head: every entry is replaced or skipped by another")
		return
	case 1:
	default:
		r.Errorf("fbc-channel-head", obj, "multiple channel heads: %s", strings.Join(heads, ", "))
		return
	}
	reached := map[string]bool{heads[0]: true}
	path := []string{heads[0]}
	cur, ok := entries[heads[0]]
	for ok {
		if cur.Replaces == "" || skipped[cur.Replaces] {
			break
		}
		path = append(path, cur.Replaces)
		if reached[cur.Replaces] {
			r.Errorf("fbc-cycle", obj, "cycle in the replaces chain: %s", strings.Join(path, " -> "))
			return
		}
		reached[cur.Replaces] = true
		cur, ok = entries[cur.Replaces]
	}
	var stranded []string
	for _, e := range ch.Entries {
		if !reached[e.Name] && !skipped[e.Name] {
			stranded = append(stranded, e.Name)
		}
	}
	sort.Strings(stranded)
	if len(stranded) > 0 {
		r.Errorf("fbc-stranded", obj, "stranded bundles (not reachable by replaces from head %s, and not skipped): %s", heads[0], strings.Join(stranded, ", "))
	}
}

func validateProperties(r *check.Report, obj string, props []Property) {
	for _, p := range props {
		switch p.Type {
		case PropertyGVK, PropertyGVKRequired:
			var g GVKProperty
			if err := json.Unmarshal(p.Value, &g); err != nil || g.Kind == "" || g.Version == "" {
				r.Errorf("fbc-bundle-properties", obj, "%s property %s needs kind and version", p.Type, string(p.Value))
			}
		case PropertyBundleObject:
			var o BundleObjectProperty
			if err := json.Unmarshal(p.Value, &o); err != nil || !json.Valid(o.Data) {
				r.Errorf("fbc-bundle-properties", obj, "olm.bundle.object data is not base64-encoded JSON")
			}
		case "":
			r.Errorf("fbc-bundle-properties", obj, "a property has no type")
		}
	}
}

func hasBundleObject(b *Bundle) bool {
	for _, p := range b.Properties {
		if p.Type == PropertyBundleObject || p.Type == PropertyCSVMetadata {
			return true
		}
	}
	return false
}

// validateIcon checks that the icon's data is the image its media type
// says. (opm has this check written but disabled; we keep our catalog
// honest.)
func validateIcon(r *check.Report, obj string, icon *Icon) {
	if icon == nil {
		return
	}
	if len(icon.Data) == 0 || icon.MediaType == "" {
		r.Errorf("fbc-icon", obj, "icon needs both base64data and mediatype")
		return
	}
	detected := http.DetectContentType(icon.Data)
	if i := strings.Index(detected, ";"); i >= 0 {
		detected = detected[:i]
	}
	if bytes.Contains(icon.Data[:min(len(icon.Data), 1024)], []byte("<svg")) {
		detected = "image/svg+xml"
	}
	if detected != icon.MediaType {
		r.Errorf("fbc-icon", obj, "icon media type %q does not match its data (%s)", icon.MediaType, detected)
	}
}
