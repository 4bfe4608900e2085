
Blogits_QuantizeLinear_OutputJD¸‡İÅ;CşI²’Ñº;Hó