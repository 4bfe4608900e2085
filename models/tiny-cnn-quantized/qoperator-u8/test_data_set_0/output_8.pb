
Blogits_quantizedJI·ƒÙÄ;DøH¹“”Ò»=Eù