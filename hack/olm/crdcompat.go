package main

import (
	"fmt"
	"path/filepath"

	"github.com/blang/semver/v4"
	"github.com/spf13/cobra"

	"github.com/model-orchestra/operator/internal/olm/check"
	"github.com/model-orchestra/operator/internal/olm/crdcompat"
)

func newCRDCompatCommand(root *string) *cobra.Command {
	var current, history, previous, version string
	cmd := &cobra.Command{
		Use:   "check-crd-compat",
		Short: "Refuse CRD changes OLM would refuse, against every earlier release",
		Long: `Compare the CRDs in config/crd/bases with those of earlier releases and
refuse every change OLM would refuse or that would break stored resources.
By default the CRDs are compared with every release in catalog/bundles
(lower than --version when given): versions installed side by side share one
CRD, so it must stay compatible with all of them. --previous compares with
one bundle directory only.`,
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
			if len(dirs) == 0 {
				fmt.Fprintln(cmd.OutOrStdout(), "no earlier release to compare with")
				return nil
			}
			var all check.Report
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
	return cmd
}
