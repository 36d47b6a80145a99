package store

import (
	"mime"
	"path"
	"strings"
)

// DefaultContentType is what an object of no known kind is served as: a download.
const DefaultContentType = "application/octet-stream"

// ContentType is the media type an object is stored and served with, derived from its key
// alone so that both backends, `submit get` and any HTTP view agree without callers naming it:
// the report is Markdown, the transcript NDJSON, the manifest and its envelope JSON, an
// artifact what its extension says (mime.TypeByExtension), and anything else (inputs, names
// without a known extension) application/octet-stream.
//
// Artifacts are written by the model, so a type a browser would run or render as a page
// (HTML, SVG, XML, JavaScript) is served as text/plain instead: opening a run's artifact in
// an S3 console or through a bucket's web endpoint shows its source and runs nothing.
func ContentType(key string) string {
	name := path.Base(key)
	switch {
	case strings.HasSuffix(name, ".md"), strings.HasSuffix(name, ".markdown"):
		return "text/markdown; charset=utf-8"
	case strings.HasSuffix(name, ".jsonl"), strings.HasSuffix(name, ".ndjson"):
		return "application/x-ndjson"
	case strings.HasSuffix(name, ".json"):
		return "application/json"
	}
	ext := strings.ToLower(path.Ext(name))
	if ext == "" || ext == name {
		return DefaultContentType
	}
	t, ok := textTypes[ext]
	if !ok {
		t = mime.TypeByExtension(ext)
	}
	if t == "" {
		return DefaultContentType
	}
	media, _, err := mime.ParseMediaType(t)
	if err != nil {
		return DefaultContentType
	}
	if active(media) {
		return "text/plain; charset=utf-8"
	}
	return t
}

// textTypes are the types of the plain-text files an agent writes most, which Go's built-in
// table lacks; without them the answer would depend on the machine's /etc/mime.types.
var textTypes = map[string]string{
	".csv":  "text/csv; charset=utf-8",
	".tsv":  "text/tab-separated-values; charset=utf-8",
	".txt":  "text/plain; charset=utf-8",
	".log":  "text/plain; charset=utf-8",
	".yaml": "application/yaml",
	".yml":  "application/yaml",
}

// active reports whether a browser would execute or render media as a document of its own.
func active(media string) bool {
	switch media {
	case "text/html", "application/xhtml+xml", "image/svg+xml", "text/xml", "application/xml",
		"text/javascript", "application/javascript", "application/x-javascript", "application/ecmascript",
		"text/ecmascript", "application/wasm", "application/x-shockwave-flash", "text/xsl", "application/xslt+xml":
		return true
	}
	return strings.HasSuffix(media, "+xml")
}
