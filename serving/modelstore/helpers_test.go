package modelstore_test

import "kiln.dev/kiln/serving"

func modelstoreModel(file string, size int64) serving.Model {
	return serving.Model{Name: "m", Format: serving.FormatGGUF, WeightsBytes: size, Path: file, File: file}
}
