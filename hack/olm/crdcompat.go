package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/blang/semver/v4"
	"github.com/spf13/cobra"

	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"

	"github.com/model-orchestra/operator/internal/olm/catalog"
	"github.com/model-orchestra/operator/internal/olm/check"
	"github.com/model-orchestra/operator/internal/olm/crdcompat"
)

func newCRDCompatCommand(root *string) *cobra.Command {
	var current, history, previous, version string
	var catalogs []string
	cmd := &cobra.Command{
		Use:   "check-crd-compat",
		Short: "Refuse CRD changes OLM would refuse, against every earlier release",
		Long: `Compare the CRDs in config/crd/bases with those of earlier releases and
refuse every change OLM would refuse or that would break stored resources.
By default the CRDs are compared with every release in catalog/bundles
(lower than --version when given): versions installed side by side share one
CRD, so it must stay compatible with all of them. --previous compares with
one bundle directory only.

Then every pair of bundles in each --catalog is checked in both directions:
installing either after the other replaces the shared CRD, which must not
drop a field (or make any other incompatible change) the other ships.`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cur, err := crdcompat.Load(filepath.Join(*root, current))
			if err != nil {
				return err
			}
			var dirs []string
			if previous != "" {
				dirs = []string{previous}
			} else {
				hist, err := historyDirs(filepath.Join(*root, history))
				if err != nil {
					return err
				}
				var below *semver.Version
				if version != "" {
					v, err := semver.Parse(version)
					if err != nil {
						return fmt.Errorf("--version: %w", err)
					}
					below = &v
				}
				for _, h := range hist {
					if below == nil || h.version.LT(*below) {
						rel, _ := filepath.Rel(*root, h.dir)
						dirs = append(dirs, rel)
					}
				}
			}
			var all check.Report
			for _, c := range catalogs {
				rep, n, err := checkCatalogInstallOrders(cmd.Context(), filepath.Join(*root, c))
				if err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%s: %d bundle(s) in either install order: %d incompatible change(s)\n", c, n, len(rep.Errors()))
				all.Merge(rep)
			}
			if len(dirs) == 0 {
				fmt.Fprintln(cmd.OutOrStdout(), "no earlier release to compare with")
				return printReport(cmd, all)
			}
			for _, d := range dirs {
				prev, err := crdcompat.Load(filepath.Join(*root, d, "manifests"))
				if err != nil {
					return err
				}
				rep := crdcompat.Compare(prev, cur)
				fmt.Fprintf(cmd.OutOrStdout(), "%s -> %s: %d incompatible change(s)\n", d, current, len(rep.Errors()))
				for i := range rep.Findings {
					rep.Findings[i].Object = d + ": " + rep.Findings[i].Object
				}
				all.Merge(rep)
			}
			return printReport(cmd, all)
		},
	}
	f := cmd.Flags()
	f.StringVar(&current, "current", "config/crd/bases", "directory of the current CRDs")
	f.StringVar(&history, "history", "catalog/bundles", "directory of earlier releases' bundles")
	f.StringVar(&previous, "previous", "", "compare with this bundle directory only")
	f.StringVar(&version, "version", "", "only compare with releases lower than this version")
	f.StringSliceVar(&catalogs, "catalog", []string{"catalog/configs", "catalog/inline"}, "File-Based Catalogs whose bundles are checked pairwise, in both install orders")
	return cmd
}

// checkCatalogInstallOrders loads the FBC in dir and checks each ordered
// pair of its bundles with crdcompat.CompareInstallOrders, on the CRDs OLM
// installs: the bundles' olm.bundle.object properties. It returns the
// report and the number of bundles.
func checkCatalogInstallOrders(ctx context.Context, dir string) (check.Report, int, error) {
	cfg, err := catalog.Load(ctx, os.DirFS(dir))
	if err != nil {
		return check.Report{}, 0, fmt.Errorf("loading %s: %w", dir, err)
	}
	var bundles []crdcompat.Installed
	for _, b := range cfg.Bundles {
		objs, err := catalog.BundleObjects(b)
		if err != nil {
			return check.Report{}, 0, err
		}
		in := crdcompat.Installed{Bundle: b.Name}
		for _, o := range objs {
			var head struct {
				Kind string `json:"kind"`
			}
			if err := json.Unmarshal(o, &head); err != nil {
				return check.Report{}, 0, fmt.Errorf("bundle %s: %w", b.Name, err)
			}
			if head.Kind != "CustomResourceDefinition" {
				continue
			}
			crd := &apiextv1.CustomResourceDefinition{}
			if err := json.Unmarshal(o, crd); err != nil {
				return check.Report{}, 0, fmt.Errorf("bundle %s: %w", b.Name, err)
			}
			in.CRDs = append(in.CRDs, crd)
		}
		if len(in.CRDs) == 0 && len(objs) == 0 {
			return check.Report{}, 0, fmt.Errorf("bundle %s in %s has no inline objects: its CRDs cannot be checked (render the catalog with make catalog)", b.Name, dir)
		}
		bundles = append(bundles, in)
	}
	return crdcompat.CompareInstallOrders(bundles), len(bundles), nil
}
