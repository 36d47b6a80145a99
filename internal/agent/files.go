package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/boxcar-run/boxcar/internal/sandbox"
	"github.com/boxcar-run/boxcar/internal/textcut"
)

const (
	// maxWriteBytes bounds the content of one write_file call.
	maxWriteBytes = 1 << 20
	// maxReadBytes bounds the size of a file read_file will open; the model pages through it
	// with offset and limit, max_output_bytes at a time.
	maxReadBytes = 8 << 20
)

// fileTools is what the built-in file tools share: the sandbox and the output cap.
type fileTools struct {
	sb        Sandbox
	maxOutput int
}

// fsError turns a sandbox error into the message the model sees.
func fsError(op, name string, err error) result {
	switch {
	case errors.Is(err, sandbox.ErrSandboxLost):
		return lostSandbox(err)
	case errors.Is(err, sandbox.ErrPathEscape):
		return failure("path %q outside the workdir; use a path relative to the workdir, without ..", name)
	case errors.Is(err, sandbox.ErrNotFound):
		return failure("failed: %s %q: no such file", op, name)
	case errors.Is(err, sandbox.ErrTooLarge):
		return failure("failed: %s %q: file larger than %d bytes", op, name, maxReadBytes)
	default:
		return failure("failed: %s %q: %v", op, name, err)
	}
}

// cleanPath validates a model-supplied path; ok is false when res holds the error to return.
func cleanPath(name string) (clean string, res result, ok bool) {
	clean, err := sandbox.CleanPath(name)
	if err != nil {
		return "", fsError("open", name, err), false
	}
	return clean, result{}, true
}

// objectParams is a tool's parameters: an object of props and no other property, required
// naming those it must have.
func objectParams(props map[string]any, required ...string) map[string]any {
	params := map[string]any{"type": "object", "properties": props, "additionalProperties": false}
	if len(required) > 0 {
		names := make([]any, len(required))
		for i, r := range required {
			names[i] = r
		}
		params["required"] = names
	}
	return params
}

// filePathDesc describes the path of a tool that reads or writes one file.
const filePathDesc = "File path relative to the working directory."

// pathParam is a file tool's path parameter.
func pathParam(desc string) map[string]any {
	return map[string]any{"type": "string", "description": desc}
}

// pathArgs is a file tool's arguments: they name one path.
type pathArgs interface{ pathArg() string }

func (a listFilesArgs) pathArg() string { return a.Path }
func (a readFileArgs) pathArg() string  { return a.Path }
func (a writeFileArgs) pathArg() string { return a.Path }

// fileArgs decodes a file tool's arguments and cleans the path they name; notDir, when set,
// refuses a path that names the working directory itself and says what to do instead. ok is
// false when res holds the error to return.
func fileArgs[A pathArgs](raw json.RawMessage, notDir string) (args A, name string, res result, ok bool) {
	if err := json.Unmarshal(raw, &args); err != nil {
		return args, "", failure("invalid arguments: %v", err), false
	}
	if name, res, ok = cleanPath(args.pathArg()); ok && name == "." && notDir != "" {
		return args, "", failure("invalid arguments: path names the working directory%s", notDir), false
	}
	return args, name, res, ok
}

// listFiles is the list_files tool.
type listFiles struct {
	fileTools
	description string
}

type listFilesArgs struct {
	Path string `json:"path"`
}

type listedFile struct {
	Path string `json:"path"`
	Size int64  `json:"size"`
}

type listFilesResult struct {
	Path      string       `json:"path"`
	Files     []listedFile `json:"files"`
	Truncated bool         `json:"truncated"`
	// Unreadable names the folders the sandbox could not list (nested past PATH_MAX, no
	// permission); UnreadableMore counts those past the ones named.
	Unreadable     []unreadableFolder `json:"unreadable,omitempty"`
	UnreadableMore int                `json:"unreadable_more,omitempty"`
}

type unreadableFolder struct {
	Path   string `json:"path"`
	Reason string `json:"reason"`
}

func (t listFiles) Definition() definition {
	return definition{
		Name: "list_files",
		Description: or(t.description, "List the files under a folder of the working directory "+
			"(recursively) with their sizes in bytes. Paths are relative to the working directory."),
		Parameters: objectParams(map[string]any{
			"path": pathParam("Folder relative to the working directory; default: the working directory itself."),
		}),
	}
}

func (t listFiles) Call(ctx context.Context, _ string, raw json.RawMessage) result {
	_, dir, res, ok := fileArgs[listFilesArgs](raw, "")
	if !ok {
		return res
	}
	infos, err := t.sb.List(ctx, dir)
	// A listing that left out folders it could not read still holds every other file: a job
	// that nests one folder past PATH_MAX must not hide the whole workdir from the model.
	var incomplete *sandbox.IncompleteError
	if err != nil && !errors.As(err, &incomplete) {
		return fsError("list", dir, err)
	}
	// The result's size is counted as the model gets it (jsonLen): a name of control bytes
	// takes six times its length.
	out := listFilesResult{Path: dir, Files: []listedFile{}}
	size := 96 + jsonLen(dir)
	if incomplete != nil {
		out.UnreadableMore = incomplete.More
		for _, s := range incomplete.Skipped {
			if size += jsonLen(s.Path) + jsonLen(s.Reason) + 32; size > t.maxOutput {
				out.UnreadableMore++
				continue
			}
			out.Unreadable = append(out.Unreadable, unreadableFolder{Path: s.Path, Reason: s.Reason})
		}
	}
	for _, fi := range infos {
		size += jsonLen(fi.Path) + 40 // the JSON of one entry: {"path":"…","size":N},
		if size > t.maxOutput {
			out.Truncated = true
			break
		}
		out.Files = append(out.Files, listedFile{Path: fi.Path, Size: fi.Size})
	}
	return result{model: out, truncated: out.Truncated}
}

// readFile is the read_file tool.
type readFile struct {
	fileTools
	description string
}

type readFileArgs struct {
	Path   string `json:"path"`
	Offset int64  `json:"offset"`
	Limit  int64  `json:"limit"`
}

type readFileResult struct {
	Path       string `json:"path"`
	Size       int64  `json:"size"`
	Offset     int64  `json:"offset"`
	Content    string `json:"content"`
	Truncated  bool   `json:"truncated"`
	NextOffset int64  `json:"next_offset,omitempty"`
}

func (t readFile) Definition() definition {
	return definition{
		Name: "read_file",
		Description: or(t.description, fmt.Sprintf("Read a text file of the working directory. "+
			"At most %d bytes come back per call; when truncated is true, call again with offset "+
			"set to next_offset. Files larger than %d bytes cannot be read.", t.maxOutput, maxReadBytes)),
		Parameters: objectParams(map[string]any{
			"path":   pathParam(filePathDesc),
			"offset": map[string]any{"type": "integer", "minimum": 0, "description": "Byte offset to start at; default 0."},
			"limit":  map[string]any{"type": "integer", "minimum": 1, "description": fmt.Sprintf("Bytes to return; default and maximum %d.", t.maxOutput)},
		}, "path"),
	}
}

func (t readFile) Call(ctx context.Context, _ string, raw json.RawMessage) result {
	args, name, res, ok := fileArgs[readFileArgs](raw, "; use list_files")
	if !ok {
		return res
	}
	data, err := t.sb.ReadFile(ctx, name, maxReadBytes)
	if err != nil {
		return fsError("read", name, err)
	}
	limit := int64(t.maxOutput)
	if args.Limit > 0 && args.Limit < limit {
		limit = args.Limit
	}
	size := int64(len(data))
	start := min(args.Offset, size)
	// End on a character boundary so the model does not see a broken character, within
	// max_output_bytes as the model gets it (jsonLen); but a page always moves on: a limit
	// shorter than the character at start returns its first bytes.
	page := []byte(jsonHead(string(textcut.Head(data[start:], int(min(limit, size-start)))), t.maxOutput))
	if len(page) == 0 {
		page = data[start:min(start+limit, size)]
	}
	end := start + int64(len(page))
	out := readFileResult{Path: name, Size: size, Offset: start, Content: string(page), Truncated: end < size}
	if out.Truncated {
		out.NextOffset = end
	}
	return result{model: out, truncated: out.Truncated}
}

// writeFile is the write_file tool.
type writeFile struct {
	fileTools
	description string
}

type writeFileArgs struct {
	Path    string `json:"path"`
	Content string `json:"content"`
}

type writeFileResult struct {
	Path    string `json:"path"`
	Written int    `json:"written"`
}

func (t writeFile) Definition() definition {
	return definition{
		Name: "write_file",
		Description: or(t.description, fmt.Sprintf("Create or replace a text file in the working "+
			"directory (parent folders are created). Content is at most %d bytes.", maxWriteBytes)),
		Parameters: objectParams(map[string]any{
			"path":    pathParam(filePathDesc),
			"content": map[string]any{"type": "string", "description": "The complete new content of the file."},
		}, "path", "content"),
	}
}

func (t writeFile) Call(ctx context.Context, _ string, raw json.RawMessage) result {
	args, name, res, ok := fileArgs[writeFileArgs](raw, ", not a file")
	if !ok {
		return res
	}
	if len(args.Content) > maxWriteBytes {
		return failure("invalid arguments: content is %d bytes, the limit is %d", len(args.Content), maxWriteBytes)
	}
	if err := t.sb.WriteFile(ctx, name, []byte(args.Content)); err != nil {
		return fsError("write", name, err)
	}
	return result{model: writeFileResult{Path: name, Written: len(args.Content)}}
}

func or(s, def string) string {
	if s != "" {
		return s
	}
	return def
}
