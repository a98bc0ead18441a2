package models

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// snapshotDir finds a repository's snapshot in a Hugging Face hub cache, in the layout
// huggingface_hub writes (and vLLM pods mount):
//
//	CACHE/models--ORG--NAME/refs/main            the commit the main branch names
//	CACHE/models--ORG--NAME/snapshots/COMMIT/…   the files (links into blobs/)
//
// revision may name a ref under refs/ or a snapshot's commit; empty means refs/main,
// else the newest snapshot (by modification time, then name). cache may also be the
// directory above hub/ (HF_HOME).
func snapshotDir(cache, repo, revision string) (string, error) {
	folder := "models--" + strings.ReplaceAll(repo, "/", "--")
	repoDir := filepath.Join(cache, folder)
	if _, err := os.Stat(repoDir); errors.Is(err, fs.ErrNotExist) {
		if alt := filepath.Join(cache, "hub", folder); isDir(alt) {
			repoDir = alt
		}
	}
	if !isDir(repoDir) {
		return "", fmt.Errorf("no %s in the cache (neither %s nor %s)", folder, repoDir, filepath.Join(cache, "hub", folder))
	}
	snapshots := filepath.Join(repoDir, "snapshots")
	if revision != "" {
		commit := revision
		if ref, err := os.ReadFile(filepath.Join(repoDir, "refs", revision)); err == nil {
			commit = strings.TrimSpace(string(ref))
		}
		dir := filepath.Join(snapshots, commit)
		if !isDir(dir) || commit == "" || strings.ContainsAny(commit, `/\`) {
			return "", fmt.Errorf("revision %q: no snapshot %s", revision, dir)
		}
		return dir, nil
	}
	if ref, err := os.ReadFile(filepath.Join(repoDir, "refs", "main")); err == nil {
		commit := strings.TrimSpace(string(ref))
		if dir := filepath.Join(snapshots, commit); commit != "" && !strings.ContainsAny(commit, `/\`) && isDir(dir) {
			return dir, nil
		}
	}
	entries, err := os.ReadDir(snapshots)
	if err != nil {
		return "", fmt.Errorf("no snapshots: %w", err)
	}
	newest, newestTime := "", int64(0)
	for _, e := range entries {
		info, err := os.Stat(filepath.Join(snapshots, e.Name())) // follows a linked snapshot
		if err != nil || !info.IsDir() {
			continue
		}
		if t := info.ModTime().UnixNano(); newest == "" || t > newestTime || t == newestTime && e.Name() > newest {
			newest, newestTime = e.Name(), t
		}
	}
	if newest == "" {
		return "", fmt.Errorf("no snapshot under %s", snapshots)
	}
	return filepath.Join(snapshots, newest), nil
}

func isDir(path string) bool {
	st, err := os.Stat(path)
	return err == nil && st.IsDir()
}
