
Blogits_quantizedJฤ8]E‘ปร~ษ2Q:ปศs