
Bmm_QuantizeLinear_OutputJCºˆ‘âÉ6CşI´”’Ö¾6Hó