param counts : i32[3, 5] = zeros
