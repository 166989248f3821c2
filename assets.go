// Package operator carries the files the operator and the orchestra CLI
// need at run time, so that a single binary is enough: watches.yaml, the
// charts it names and the CustomResourceDefinitions.
package operator

import (
	"embed"
	"io/fs"
)

// WatchesFile is the name of the embedded watches file in FS.
const WatchesFile = "watches.yaml"

// CRDFile is the embedded ModelOrchestra CustomResourceDefinition in FS.
const CRDFile = "config/crd/bases/modelorchestra.io_modelorchestras.yaml"

// The other embedded CustomResourceDefinitions in FS.
const (
	CheckpointPolicyCRDFile = "config/crd/bases/modelorchestra.io_checkpointpolicies.yaml"
	ModelCheckpointCRDFile  = "config/crd/bases/modelorchestra.io_modelcheckpoints.yaml"
)

//go:embed watches.yaml all:charts/model-orchestra config/crd/bases/*.yaml
var files embed.FS

// FS holds watches.yaml, charts/model-orchestra (with its subcharts) and config/crd/bases, at the
// paths they have in the repository; watches.yaml names charts relative to
// its root.
var FS fs.FS = files

// Watches returns the embedded watches.yaml.
func Watches() []byte {
	b, err := fs.ReadFile(files, WatchesFile)
	if err != nil {
		panic("embedded watches.yaml is missing: " + err.Error()) // impossible: go:embed checked it at build time
	}
	return b
}

// ModelOrchestraCRD returns the embedded ModelOrchestra CRD as YAML.
func ModelOrchestraCRD() []byte { return mustRead(CRDFile) }

// CheckpointPolicyCRD returns the embedded CheckpointPolicy CRD as YAML.
func CheckpointPolicyCRD() []byte { return mustRead(CheckpointPolicyCRDFile) }

// ModelCheckpointCRD returns the embedded ModelCheckpoint CRD as YAML.
func ModelCheckpointCRD() []byte { return mustRead(ModelCheckpointCRDFile) }

func mustRead(name string) []byte {
	b, err := fs.ReadFile(files, name)
	if err != nil {
		panic("embedded " + name + " is missing: " + err.Error()) // impossible: go:embed checked it at build time
	}
	return b
}
