
Bmm_DequantizeLinear_OutputJPí‚À et?«4º¿@{Q¿»¿(@›©Ë?ÈÀÈÀpÀ3ŠÀ et@ÛÕ…ÀÛÕ…?î"¿î"¿øa@p?n’ÎÀ¨›À3ŠÀóMw@