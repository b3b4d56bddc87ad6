package capture

import (
	"io/fs"

	"kiln.dev/kiln/kfd"
	"kiln.dev/kiln/snapshot"
)

// A copy of /sys/class/kfd/kfd/topology: nodes/<n>/properties (with
// io_links, p2p_links, mem_banks), possibly system_properties and
// generation_id, at the top of the directory or under a "topology" folder.
func init() {
	RegisterTree(TreeImporter{
		Kind: "kfd-topology",
		Detect: func(fsys fs.FS) bool {
			_, ok := kfd.Root(fsys)
			return ok
		},
		Parse: parseKFDTree,
	})
}

func parseKFDTree(fsys fs.FS, name string) (*snapshot.Snapshot, error) {
	s, err := kfd.Read(fsys)
	if err != nil {
		return nil, err
	}
	s.Sources = []snapshot.Source{{Kind: "kfd-topology", Path: name}}
	for i := range s.Notes {
		s.Notes[i].Source = "kfd-topology"
	}
	return s, nil
}
