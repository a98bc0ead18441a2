//go:build unix

package tlsfiles

import (
	"os"
	"syscall"
)

// inode returns the file's inode number: a file replaced by a rename (a Kubernetes
// secret volume's symlink swap, an editor's save) has a new one even when its size and
// modification time match the old file's.
func inode(fi os.FileInfo) uint64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return uint64(st.Ino)
	}
	return 0
}
