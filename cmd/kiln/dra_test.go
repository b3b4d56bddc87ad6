package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestDRAShim: kiln dra and kiln kube label run kiln-dra from PATH with
// the arguments given, and take its output and exit code; without
// kiln-dra they say how to build it and exit 3.
func TestDRAShim(t *testing.T) {
	dir := t.TempDir()
	fake := "#!/bin/sh\necho \"kiln-dra got: $*\"\n[ \"$1\" = fail ] && exit 7\nexit 0\n"
	if err := os.WriteFile(filepath.Join(dir, "kiln-dra"), []byte(fake), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
	for _, tc := range []struct {
		args []string
		code int
		out  string
	}{
		{[]string{"dra", "slices", "--from", "x.txt", "-o", "json"}, 0, "kiln-dra got: slices --from x.txt -o json"},
		{[]string{"kube", "label", "--from", "x.txt", "--apply"}, 0, "kiln-dra got: label --from x.txt --apply"},
		{[]string{"dra", "fail"}, 7, "kiln-dra got: fail"},
	} {
		var out, errb bytes.Buffer
		if code := run(context.Background(), tc.args, &out, &errb); code != tc.code || strings.TrimSpace(out.String()) != tc.out {
			t.Errorf("kiln %s: exit %d, %q (%s); want %d, %q", strings.Join(tc.args, " "), code, out.String(), errb.String(), tc.code, tc.out)
		}
	}

	t.Setenv("PATH", t.TempDir())
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"kube", "label"}, &out, &errb); code != 3 || !strings.Contains(errb.String(), "go build -o") {
		t.Errorf("without kiln-dra: exit %d, %q; want 3 and how to build it", code, errb.String())
	}
}
