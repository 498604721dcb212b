// Package mutation holds the mutation check of delayd's tests: a table of
// deliberate breakages of its code (the scanner and the bridge mostly,
// any package's), each of a promise delayd makes to its users, and a test
// that applies each one (through go test -overlay, so the checkout is
// never touched) and says which test caught it. It is slow (minutes), so
// it runs only when asked:
//
//	DELAYD_MUTATION=1 go test -count=1 -timeout 60m -v -run TestMutations ./internal/mutation
//
// TestSnippetsCurrent runs always, and fails as soon as a snippet of the
// table no longer occurs exactly once in its file: the table is kept in
// step with the code, not left to rot until the next mutation run.
package mutation
