// Package catalog renders this project's semver catalog template into a
// File-Based Catalog (FBC), and loads, writes and validates FBCs with the
// rules of `opm validate`.
//
// opm renders a semver template by pulling every bundle image. This project
// has its bundles in the repository (the current one in bundle/, earlier
// releases in catalog/bundles/<version>/), so Render takes a resolver that
// maps a template image to a local bundle directory instead of a registry.
package catalog

import (
	"encoding/json"
	"fmt"
)

// FBC schemas.
const (
	SchemaPackage      = "olm.package"
	SchemaChannel      = "olm.channel"
	SchemaBundle       = "olm.bundle"
	SchemaDeprecations = "olm.deprecations"
)

// Bundle property types.
const (
	PropertyPackage         = "olm.package"
	PropertyGVK             = "olm.gvk"
	PropertyGVKRequired     = "olm.gvk.required"
	PropertyPackageRequired = "olm.package.required"
	PropertyBundleObject    = "olm.bundle.object"
	PropertyCSVMetadata     = "olm.csv.metadata"
	PropertyConstraint      = "olm.constraint"
)

// DeclarativeConfig is a parsed FBC.
type DeclarativeConfig struct {
	Packages []Package
	Channels []Channel
	Bundles  []Bundle
	// Others are documents of schemas this package does not interpret
	// (olm.deprecations among them); opm keeps them too.
	Others []Meta
}

// Package is an olm.package document.
type Package struct {
	Schema         string     `json:"schema"`
	Name           string     `json:"name"`
	DefaultChannel string     `json:"defaultChannel"`
	Icon           *Icon      `json:"icon,omitempty"`
	Description    string     `json:"description,omitempty"`
	Properties     []Property `json:"properties,omitempty"`
}

// Icon is a package icon.
type Icon struct {
	Data      []byte `json:"base64data"`
	MediaType string `json:"mediatype"`
}

// Channel is an olm.channel document: the only source of upgrade edges.
type Channel struct {
	Schema     string         `json:"schema"`
	Package    string         `json:"package"`
	Name       string         `json:"name"`
	Entries    []ChannelEntry `json:"entries"`
	Properties []Property     `json:"properties,omitempty"`
}

// ChannelEntry is one bundle in a channel with its incoming edges.
type ChannelEntry struct {
	Name      string   `json:"name"`
	Replaces  string   `json:"replaces,omitempty"`
	Skips     []string `json:"skips,omitempty"`
	SkipRange string   `json:"skipRange,omitempty"`
}

// Bundle is an olm.bundle document.
type Bundle struct {
	Schema        string         `json:"schema"`
	Name          string         `json:"name"`
	Package       string         `json:"package"`
	Image         string         `json:"image"`
	Properties    []Property     `json:"properties,omitempty"`
	RelatedImages []RelatedImage `json:"relatedImages,omitempty"`
}

// RelatedImage is an image a bundle may run. The bundle image itself and
// unnamed operator containers have an empty name, as opm writes them.
type RelatedImage struct {
	Name  string `json:"name"`
	Image string `json:"image"`
}

// Property is a typed bundle property.
type Property struct {
	Type  string          `json:"type"`
	Value json.RawMessage `json:"value"`
}

// PackageProperty is the value of olm.package.
type PackageProperty struct {
	PackageName string `json:"packageName"`
	Version     string `json:"version"`
}

// GVKProperty is the value of olm.gvk and olm.gvk.required.
type GVKProperty struct {
	Group   string `json:"group"`
	Kind    string `json:"kind"`
	Version string `json:"version"`
}

// BundleObjectProperty is the value of olm.bundle.object: one manifest of
// the bundle, JSON, base64-encoded.
type BundleObjectProperty struct {
	Data []byte `json:"data"`
}

// Meta is a document of any schema.
type Meta struct {
	Schema  string
	Package string
	Name    string
	Blob    json.RawMessage
}

// NewProperty builds a property from a typed value.
func NewProperty(typ string, v any) (Property, error) {
	data, err := json.Marshal(v)
	if err != nil {
		return Property{}, fmt.Errorf("encoding %s property: %w", typ, err)
	}
	return Property{Type: typ, Value: data}, nil
}

// packageProperties returns the decoded olm.package properties of b.
func packageProperties(b Bundle) ([]PackageProperty, error) {
	var out []PackageProperty
	for _, p := range b.Properties {
		if p.Type != PropertyPackage {
			continue
		}
		var v PackageProperty
		if err := json.Unmarshal(p.Value, &v); err != nil {
			return nil, fmt.Errorf("property %s: %w", p.Type, err)
		}
		out = append(out, v)
	}
	return out, nil
}
