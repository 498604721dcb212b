package store

import (
	"context"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// storeSource parses the package's non-test Go files, by file name.
func storeSource(t *testing.T) (map[string]*ast.File, *token.FileSet) {
	t.Helper()
	fset := token.NewFileSet()
	names, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]*ast.File{}
	for _, n := range names {
		if strings.HasSuffix(n, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, n, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		files[n] = f
	}
	return files, fset
}

// opConsts are the string constants of ops.go: the operation names, by
// constant name.
func opConsts(t *testing.T, f *ast.File) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.CONST {
			continue
		}
		for _, sp := range g.Specs {
			vs := sp.(*ast.ValueSpec)
			for i, name := range vs.Names {
				if i >= len(vs.Values) {
					continue
				}
				if lit, ok := vs.Values[i].(*ast.BasicLit); ok && lit.Kind == token.STRING {
					out[name.Name], _ = strconv.Unquote(lit.Value)
				}
			}
		}
	}
	return out
}

// calledName is the name of the function or method a call calls, without
// its type arguments.
func calledName(c *ast.CallExpr) string {
	fun := c.Fun
	switch f := fun.(type) {
	case *ast.IndexExpr:
		fun = f.X
	case *ast.IndexListExpr:
		fun = f.X
	}
	switch f := fun.(type) {
	case *ast.Ident:
		return f.Name
	case *ast.SelectorExpr:
		return f.Sel.Name
	}
	return ""
}

// Every writing operation declares its policy: each operation name of
// ops.go has one, with its reason; every script call goes through exec,
// naming one of them; and every script in lua/ is run by an operation of
// the table. An operation added without a policy fails here.
func TestEveryOperationHasAPolicy(t *testing.T) {
	t.Parallel()
	files, fset := storeSource(t)
	consts := opConsts(t, files["ops.go"])
	declared := map[string]bool{}
	for name, op := range consts {
		declared[op] = true
		p, ok := policies[op]
		if !ok {
			t.Errorf("operation %s (%q) has no policy in ops.go", name, op)
			continue
		}
		if p.why == "" || len(p.scripts) == 0 {
			t.Errorf("the policy of %s names no script or no reason: %+v", op, p)
		}
		if p.fenced && p.wait == neverWaits {
			t.Errorf("%s never waits, yet is fenced: a fence only serves a wait", op)
		}
	}
	for op := range policies {
		if !declared[op] {
			t.Errorf("policy %q is for no operation constant of ops.go", op)
		}
	}

	// Scripts run through exec only, for an operation of the table.
	send := []string{"EvalSha", "Eval", "EvalRO", "EvalShaRO", "Run", "RunRO", "FCall", "FCallRo", "FCallRO"}
	for name, f := range files {
		ast.Inspect(f, func(n ast.Node) bool {
			if d, ok := n.(*ast.FuncDecl); ok && (d.Name.Name == "exec1" || d.Name.Name == "execByNode") {
				return false // passes its own op on to exec
			}
			if c, ok := n.(*ast.CallExpr); ok && calledName(c) == "execByNode" {
				if id, ok := c.Args[2].(*ast.Ident); !ok || consts[id.Name] == "" {
					t.Errorf("%s: execByNode for an operation that is not a constant of ops.go: %s", fset.Position(c.Pos()), nodeText(fset, c.Args[2]))
				}
			}
			c, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			at := fset.Position(c.Pos())
			switch fn := calledName(c); {
			case fn == "exec" || fn == "exec1":
				if len(c.Args) < 3 {
					t.Errorf("%s: %s with %d arguments", at, fn, len(c.Args))
					return true
				}
				if id, ok := c.Args[2].(*ast.Ident); !ok || consts[id.Name] == "" {
					t.Errorf("%s: %s for an operation that is not a constant of ops.go: %s", at, fn, nodeText(fset, c.Args[2]))
				}
			case slices.Contains(send, fn) && name != "script.go":
				t.Errorf("%s: %s runs a script outside exec (ops.go) and send (script.go)", at, fn)
			case fn == "send" && name != "ops.go" && name != "script.go":
				t.Errorf("%s: send called outside exec (ops.go)", at)
			}
			return true
		})
	}

	// Every script in lua/ is the script of an operation.
	lua, err := filepath.Glob("lua/*.lua")
	if err != nil || len(lua) == 0 {
		t.Fatalf("no scripts in lua/: %v", err)
	}
	run := map[string]bool{}
	fences := false
	for _, p := range policies {
		for _, sc := range p.scripts {
			run[sc.name] = true
		}
		fences = fences || p.fenced
	}
	for _, f := range lua {
		name := strings.TrimSuffix(filepath.Base(f), ".lua")
		switch {
		case name == "prelude":
		case name == fenceScript.name:
			if !fences {
				t.Errorf("%s: no operation is fenced", f)
			}
		case !run[name]:
			t.Errorf("%s is the script of no operation in ops.go", f)
		}
	}
	for _, sc := range allScripts {
		if !run[sc.name] {
			t.Errorf("Ping loads %s.lua, which no operation runs", sc.name)
		}
	}
}

func nodeText(fset *token.FileSet, n ast.Node) string {
	src, err := os.ReadFile(fset.Position(n.Pos()).Filename)
	if err != nil {
		return "?"
	}
	return string(src[fset.Position(n.Pos()).Offset:fset.Position(n.End()).Offset])
}

// exec refuses an operation without a policy, and a script the
// operation's policy does not name, before it sends anything.
func TestExecRefusesUndeclared(t *testing.T) {
	t.Parallel()
	s := &Store{}
	for _, tc := range []struct {
		op   string
		call func()
	}{
		{"nosuch", func() { exec1(context.Background(), s, "nosuch", ackArgs{shards: []ackShard{{keys: &shardKeys{}}}}) }},
		{OpAck, func() { exec1(context.Background(), s, OpAck, replayArgs{shard: &shardKeys{}}) }},
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: exec ran it", tc.op)
				}
			}()
			tc.call()
		}()
	}
}

// The operations that wait are those the docs (operations.md,
// configuration.md) and the help of the wait metrics name: a policy
// changed in ops.go must change them too.
func TestWaitOps(t *testing.T) {
	t.Parallel()
	if got, want := WaitOps(), []string{OpCancel, OpClaim, OpSchedule}; !slices.Equal(got, want) {
		t.Errorf("the operations that wait are %v; the docs and metric help name %v", got, want)
	}
}
