"""MADlib-style preprocessors: tables of arrays packed into ready mini-batches (issue 5).

So far: the buffer plan (`buffers`) and the encodings (`encoding`); the preprocessors that write
packed datasets build on them.
"""
