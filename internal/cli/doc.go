package cli

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// CommonFlag is the annotation of a flag that several commands share (submit's --nats, --store,
// …): FlagTables lists it once, before the commands' own.
const CommonFlag = "boxcar/common"

// FlagTables is the markdown of root's flags, the tables docs/cli.md carries: the root
// command's own flags, the shared ones once, then each command's own, in the order --help
// lists them. A test compares the docs with it, so the two cannot drift.
func FlagTables(root *cobra.Command) string {
	var b strings.Builder
	table(&b, "`"+root.Name()+"`", root, func(f *pflag.Flag) bool { return true })
	var common []*pflag.Flag
	seen := map[string]bool{}
	for _, c := range root.Commands() {
		fs := c.LocalFlags()
		fs.SortFlags = c.Flags().SortFlags
		fs.VisitAll(func(f *pflag.Flag) {
			if _, ok := f.Annotations[CommonFlag]; ok && !seen[f.Name] {
				seen[f.Name] = true
				common = append(common, f)
			}
		})
	}
	if len(common) > 0 {
		rows(&b, "Common flags of `"+root.Name()+"` commands", common)
	}
	for _, c := range root.Commands() {
		if c.IsAvailableCommand() {
			table(&b, "`"+c.CommandPath()+"`", c, func(f *pflag.Flag) bool {
				_, shared := f.Annotations[CommonFlag]
				return !shared
			})
		}
	}
	return b.String()
}

func table(b *strings.Builder, title string, c *cobra.Command, keep func(*pflag.Flag) bool) {
	var flags []*pflag.Flag
	fs := c.LocalNonPersistentFlags()
	fs.SortFlags = c.Flags().SortFlags // the order --help shows
	fs.VisitAll(func(f *pflag.Flag) {
		if !f.Hidden && f.Name != "help" && f.Name != "version" && keep(f) {
			flags = append(flags, f)
		}
	})
	if len(flags) > 0 {
		rows(b, title, flags)
	}
}

func rows(b *strings.Builder, title string, flags []*pflag.Flag) {
	fmt.Fprintf(b, "%s:\n\n| flag | meaning |\n| --- | --- |\n", title)
	for _, f := range flags {
		name, usage := pflag.UnquoteUsage(f)
		flag := "--" + f.Name
		if name != "" {
			flag += " " + name
		}
		switch f.DefValue {
		case "", "false", "[]", "0", "0s":
		default:
			usage += fmt.Sprintf(" (default `%s`)", f.DefValue)
		}
		cell := strings.NewReplacer("|", `\|`)
		fmt.Fprintf(b, "| `%s` | %s |\n", cell.Replace(flag), cell.Replace(usage))
	}
	b.WriteString("\n")
}
