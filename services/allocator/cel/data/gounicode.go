//go:build ignore

// gounicode.go writes gounicode.json: the Unicode tables Go's regexp/syntax
// reads (unicode.Categories, Scripts, FoldCategory, FoldScript,
// CategoryAliases, the SimpleFold orbits and Cn), as the Go toolchain that
// builds Kubernetes has them. Regenerate with the Go that builds the
// control plane:
//
//	go run services/allocator/cel/data/gounicode.go > services/allocator/cel/data/gounicode.json
package main

import (
	"encoding/json"
	"os"
	"runtime"
	"unicode"
)

func flat(t *unicode.RangeTable) []int {
	out := []int{}
	for _, r := range t.R16 {
		out = append(out, int(r.Lo), int(r.Hi), int(r.Stride))
	}
	for _, r := range t.R32 {
		out = append(out, int(r.Lo), int(r.Hi), int(r.Stride))
	}
	return out
}

func tables(m map[string]*unicode.RangeTable) map[string][]int {
	out := map[string][]int{}
	for name, t := range m {
		out[name] = flat(t)
	}
	return out
}

func main() {
	// fold[c] = SimpleFold(c), for every c that folds to another rune.
	fold := []int{}
	for c := rune(0); c <= unicode.MaxRune; c++ {
		if f := unicode.SimpleFold(c); f != c {
			fold = append(fold, int(c), int(f))
		}
	}
	doc := map[string]any{
		"go":              runtime.Version(),
		"unicode":         unicode.Version,
		"categories":      tables(unicode.Categories),
		"scripts":         tables(unicode.Scripts),
		"foldCategory":    tables(unicode.FoldCategory),
		"foldScript":      tables(unicode.FoldScript),
		"categoryAliases": unicode.CategoryAliases,
		"cn":              flat(unicode.Cn),
		"simpleFold":      fold,
	}
	enc := json.NewEncoder(os.Stdout)
	if err := enc.Encode(doc); err != nil {
		panic(err)
	}
}
