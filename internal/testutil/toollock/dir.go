package toollock

import (
	"os"
	"path/filepath"
)

// Dir is where the pinned tools live, each in <tool>-<version>:
// DELAYD_TOOLS_DIR when set (./test.sh sets it to the dir it installs
// into), else delayd-tools in the user's cache dir.
func Dir() string {
	if d := os.Getenv("DELAYD_TOOLS_DIR"); d != "" {
		return d
	}
	dir, err := os.UserCacheDir()
	if err != nil {
		dir = os.TempDir()
	}
	return filepath.Join(dir, "delayd-tools")
}
