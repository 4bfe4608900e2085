
Blogits_DequantizeLinear_OutputJP9É‚À³®y?J¸¿uV¿‡{#@Ö-Ä?-œËÀÈ——À‘7ŠÀ“ @)Â…À»ˆ?wt&¿wt&¿ø¬@Ø”?ÑÀP–À‘7ŠÀÁL@