package runner

// wordRow is one row of a table of words (tenantWords, fileWords): a class of error, and what
// is told of it.
type wordRow struct {
	// name names the row for its tests (each row has a case; docs/lifecycle.md lists the
	// tenant's).
	name string
	when func(err error) bool
	// words say what failed, and what may be done, in fixed words: the error's own text goes
	// to the worker's log only, with the job's id.
	words string
	// own: the error's text is made only of what its reader gave or may read, and is told as
	// it is instead of words.
	own bool
}

// wordTable is what is told of an error: the first of rows that matches it, or fallback when
// none does; suffix follows fixed words (a row's, fallback), never an error's own text. A new
// class of error is a new row.
type wordTable struct {
	rows     []wordRow
	fallback string
	suffix   string
}

// tell is what the table says of err, and whether that is err's own text.
func (t wordTable) tell(err error) (text string, own bool) {
	for _, w := range t.rows {
		if w.when(err) {
			if w.own {
				return err.Error(), true
			}
			return w.words + t.suffix, false
		}
	}
	return t.fallback + t.suffix, false
}
