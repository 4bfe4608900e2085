
Blogits_quantizedJÉ7YD™»ÄxÈ9R;•½Åy