// Renders a Helm chart's templates with Go's text/template (the engine Helm uses) and
// stand-ins for the Sprig/Helm functions this chart calls, for machines where helm
// itself cannot be installed (tests/test_deploy.py). It checks that every template
// parses and executes with the given values and prints the rendered manifests; it is
// not Helm: no hooks, no subcharts, no lookup, and toYaml is a small block-style
// emitter (sorted keys as Helm's, strings always double-quoted).
//
//	go run deploy/helm/render/main.go CHART_DIR < input.json
//
// input.json: {"Values": {...}, "Chart": {"Name", "Version", "AppVersion"},
// "Release": {"Name", "Namespace", "Service"}} (the test builds it from Chart.yaml
// and values.yaml with PyYAML, since Go's standard library reads no YAML).
package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"text/template"
)

func indent(n int, s string) string {
	pad := strings.Repeat(" ", n)
	return pad + strings.ReplaceAll(s, "\n", "\n"+pad)
}

func toJSON(v interface{}) string {
	out, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return string(out)
}

// toYAML writes v in block style, as Helm's toYaml does, so that a template may put
// it under a key next to other keys (`httpGet: ...` then `{{ toYaml .probe | nindent }}`).
func toYAML(v interface{}) string {
	var b strings.Builder
	writeYAML(&b, v, 0)
	return strings.TrimSuffix(b.String(), "\n")
}

func scalar(v interface{}) string {
	switch x := v.(type) {
	case nil:
		return "null"
	case string:
		return toJSON(x)
	}
	return toJSON(v)
}

func writeYAML(b *strings.Builder, v interface{}, depth int) {
	pad := strings.Repeat("  ", depth)
	switch x := v.(type) {
	case map[string]interface{}:
		if len(x) == 0 {
			b.WriteString(pad + "{}\n")
			return
		}
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			writeEntry(b, pad+k+":", x[k], depth)
		}
	case []interface{}:
		if len(x) == 0 {
			b.WriteString(pad + "[]\n")
			return
		}
		for _, item := range x {
			if m, ok := item.(map[string]interface{}); ok && len(m) > 0 {
				var inner strings.Builder
				writeYAML(&inner, m, depth+1)
				text := inner.String()
				b.WriteString(pad + "- " + strings.TrimPrefix(text, pad+"  "))
				continue
			}
			writeEntry(b, pad+"-", item, depth)
		}
	default:
		b.WriteString(pad + scalar(x) + "\n")
	}
}

func writeEntry(b *strings.Builder, head string, v interface{}, depth int) {
	switch x := v.(type) {
	case map[string]interface{}:
		if len(x) > 0 {
			b.WriteString(head + "\n")
			writeYAML(b, x, depth+1)
			return
		}
		b.WriteString(head + " {}\n")
	case []interface{}:
		if len(x) > 0 {
			b.WriteString(head + "\n")
			writeYAML(b, x, depth+1)
			return
		}
		b.WriteString(head + " []\n")
	default:
		b.WriteString(head + " " + scalar(x) + "\n")
	}
}

func empty(v interface{}) bool {
	switch x := v.(type) {
	case nil:
		return true
	case string:
		return x == ""
	case bool:
		return !x
	case float64:
		return x == 0
	case []interface{}:
		return len(x) == 0
	case map[string]interface{}:
		return len(x) == 0
	}
	return false
}

func main() {
	chart := os.Args[1]
	var input map[string]interface{}
	if err := json.NewDecoder(os.Stdin).Decode(&input); err != nil {
		fmt.Fprintln(os.Stderr, "render: input:", err)
		os.Exit(2)
	}
	root := template.New("chart")
	funcs := template.FuncMap{
		"toYaml":  toYAML,
		"toJson":  toJSON,
		"nindent": func(n int, s string) string { return "\n" + indent(n, s) },
		"indent":  indent,
		"quote":   func(v interface{}) string { return fmt.Sprintf("%q", fmt.Sprint(v)) },
		"trunc": func(n int, s string) string {
			if len(s) > n {
				return s[:n]
			}
			return s
		},
		"trimSuffix": func(suffix, s string) string { return strings.TrimSuffix(s, suffix) },
		"replace":    func(old, new, s string) string { return strings.ReplaceAll(s, old, new) },
		"contains":   func(substr, s string) bool { return strings.Contains(s, substr) },
		"sha256sum":  func(s string) string { return fmt.Sprintf("%x", sha256.Sum256([]byte(s))) },
		"default": func(d interface{}, v ...interface{}) interface{} {
			if len(v) == 0 || empty(v[0]) {
				return d
			}
			return v[0]
		},
		"include": func(name string, data interface{}) (string, error) {
			var buf bytes.Buffer
			err := root.ExecuteTemplate(&buf, name, data)
			return buf.String(), err
		},
	}
	root.Funcs(funcs).Option("missingkey=zero")
	var files []string
	filepath.Walk(filepath.Join(chart, "templates"), func(path string, info os.FileInfo, err error) error {
		if err == nil && !info.IsDir() && (strings.HasSuffix(path, ".yaml") || strings.HasSuffix(path, ".tpl")) {
			files = append(files, path)
		}
		return nil
	})
	sort.Strings(files)
	for _, path := range files {
		text, err := os.ReadFile(path)
		if err != nil {
			panic(err)
		}
		name, _ := filepath.Rel(chart, path)
		if _, err := root.New(name).Parse(string(text)); err != nil {
			fmt.Fprintln(os.Stderr, "render: parse:", err)
			os.Exit(1)
		}
	}
	input["Template"] = map[string]interface{}{"BasePath": "templates"}
	for _, path := range files {
		name, _ := filepath.Rel(chart, path)
		if strings.HasSuffix(name, ".tpl") || strings.HasPrefix(filepath.Base(name), "_") {
			continue
		}
		var buf bytes.Buffer
		if err := root.ExecuteTemplate(&buf, name, input); err != nil {
			fmt.Fprintln(os.Stderr, "render: execute:", err)
			os.Exit(1)
		}
		fmt.Printf("---\n# Source: %s\n%s\n", name, buf.String())
	}
}
