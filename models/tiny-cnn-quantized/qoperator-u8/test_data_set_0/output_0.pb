
Blogits_quantizedJDธÝล;CþIฒ’ับ;H๓