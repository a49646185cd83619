package prompt

import "strconv"

// RenderText appends a completion prompt to seq as is.
func RenderText(seq *Sequence, text string) { seq.AppendText(text) }

// RenderIDs appends a token-id prompt to seq: every id becomes one token
// whose text is a space and the id in decimal, so the prompt counts exactly
// len(ids) tokens.
func RenderIDs(seq *Sequence, ids []int64) {
	for _, id := range ids {
		seq.Text = append(seq.Text, ' ')
		seq.Text = strconv.AppendInt(seq.Text, id, 10)
		seq.Ends = append(seq.Ends, int32(len(seq.Text)))
	}
}
