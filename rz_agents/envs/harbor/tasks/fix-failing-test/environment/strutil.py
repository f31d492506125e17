def reverse_words(text):
    return ' '.join(text.split(' ')[::1])
