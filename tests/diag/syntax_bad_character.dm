# Poor: the lexer and then the parser report the same character; "NL" and
# "BAD_CHAR" are bison token names.
input x : f32[4]
y = relu(x) $ 2
